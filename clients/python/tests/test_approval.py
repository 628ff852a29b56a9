"""Approvals (`protocol.md` §7): asked, answered, denied, and replayed on resume."""

from __future__ import annotations

import threading

import pytest

import execrelay

from conftest import connect_when_online

POLICY = ('default = "allow"\n'
          '[[rule]]\nprogram = "echo"\naction = "ask"\nreason = "says things"\n'
          '[[rule]]\nprogram = "rm"\naction = "deny"\n')


@pytest.fixture(scope="module")
def policy_targets(servers, creds):
    policy = servers.write_file("approval-policy.toml", POLICY)
    from conftest import KEEPALIVE
    return {
        "ws": (servers.ws("--exec-policy", policy, *KEEPALIVE).url, {}),
        "noise": (servers.noise("--exec-policy", policy, *KEEPALIVE).url, dict(creds)),
        "relay": (servers.relay_pair("--exec-policy", policy, *KEEPALIVE)[2], dict(creds)),
    }


@pytest.fixture(params=["ws", "noise", "relay"])
def ptarget(request, policy_targets):
    return policy_targets[request.param]


def test_asked_and_approved(ptarget):
    url, kw = ptarget
    asked = []

    def approve(req):
        asked.append(req)
        return True

    with connect_when_online(url, on_approval=approve, **kw) as c:
        r = c.run(["echo", "hi"], cwd="/tmp", env={"X": "1"})
        assert r.stdout == b"hi\n"
    assert len(asked) == 1
    req = asked[0]
    assert req.argv == ["echo", "hi"] and req.rule == "says things" and req.cwd == "/tmp"
    assert "X" in req.env_names and req.tty is False and req.id.startswith("s-")


def test_asked_and_denied(ptarget):
    url, kw = ptarget
    with connect_when_online(url, on_approval=lambda req: False, **kw) as c:
        with pytest.raises(execrelay.NotApprovedError):
            c.run(["echo", "no"])
        assert c.run(["true"]).exit_code == 0  # not asked about


def test_no_handler_is_a_denial(ptarget):
    url, kw = ptarget
    with connect_when_online(url, **kw) as c:
        with pytest.raises(execrelay.NotApprovedError):
            c.run(["echo", "no"])


def test_policy_deny(ptarget):
    url, kw = ptarget
    with connect_when_online(url, on_approval=lambda req: True, **kw) as c:
        with pytest.raises(execrelay.NotApprovedError) as e:
            c.run(["rm", "-f", "/nonexistent"])
        assert "policy" in e.value.reason


def test_replayed_on_resume(ptarget, make_proxy):
    """The link dies while the question is pending; the resumed connection gets the same
    request again (same id), answered once, and the start goes ahead."""
    url, kw = ptarget
    proxy, purl = make_proxy(url)
    calls = []
    answered = threading.Event()

    def approve(req):
        calls.append(req.id)
        proxy.cut()  # the answer goes to a dead connection
        answered.set()
        return True

    with connect_when_online(purl, on_approval=approve, **kw) as c:
        r = c.run(["echo", "after-resume"])
        assert r.stdout == b"after-resume\n"
        assert c.resumes >= 1
    assert answered.is_set()
    assert len(calls) == 1, f"the handler was asked {len(calls)} times: {calls}"
