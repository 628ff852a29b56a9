"""Client features whose server side is specified but not in every server yet.

Each test uses the feature end to end and FAILS, saying which server feature is missing,
against a server without it (never skips): `reason` in exit notices, the `-32007` start
error, `sessionTtlMs`, `outputCapKeep: "headAndTail"` with `process/outputOmitted`, binary
writes (`capabilities.binaryInput`) and Noise suite 1 (AESGCM).
"""

from __future__ import annotations

import hashlib
import os

import pytest

import execrelay

from conftest import connect_when_online


def lacks(feature: str) -> str:
    return f"server lacks feature: {feature}"


def test_exit_reason_from_server(client):
    p = client.start(["sleep", "30"])
    p.terminate(grace=0.1)
    r = p.wait(30)
    assert r.reason_from_server, lacks("`reason` in process/exited (protocol.md §5)")
    assert r.reason == "terminated"
    r = client.run(["sleep", "30"], timeout=0.2)
    assert r.reason == "timeout"
    r = client.run("kill -9 $$")
    assert (r.signal, r.reason) == ("SIGKILL", "exited")


def test_start_error_names_what_and_path(client, tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(execrelay.StartError) as e:
        client.run(["true"], cwd=missing)
    assert e.value.code == -32007, lacks("the -32007 start error (protocol.md §2)")
    assert (e.value.what, e.value.path, e.value.errno) == ("cwd", missing, "ENOENT")
    with pytest.raises(execrelay.StartError) as e:
        client.run(["nosuchprog-xyz"])
    assert (e.value.what, e.value.errno, e.value.exit_code) == ("program", "ENOENT", 127)
    assert "nosuchprog-xyz" in str(e.value)
    f = tmp_path / "noexec"
    f.write_text("#!/bin/sh\n")
    os.chmod(f, 0o644)
    with pytest.raises(execrelay.StartError) as e:
        client.run([str(f)])
    assert (e.value.what, e.value.errno, e.value.exit_code) == ("program", "EACCES", 126)


def test_session_ttl_granted(target):
    with connect_when_online(target["url"], session_ttl=600, **target["kw"]) as c:
        assert c.limits.get("detachedSessionTtlMs") == 600_000, lacks("sessionTtlMs (protocol.md §3)")


CAP = 1 << 20
TOTAL = 50 * 1000 * 1000
GEN = ("python3 -c \"import sys,hashlib\n"
       "w=sys.stdout.buffer\n"
       "for i in range({blocks}):\n"
       "    w.write(hashlib.sha256(str(i).encode()).digest()*1024)\n\"")


@pytest.mark.parametrize("cut", [False, True], ids=["steady", "resumed"])
def test_head_and_tail(target, make_proxy, cut):
    blocks = TOTAL // 32768 + 1
    total = blocks * 32768
    proxy, url = make_proxy(target["url"])
    with connect_when_online(url, **target["kw"]) as c:
        if cut:
            proxy.cut_after_down(300_000)
        p = c.start(GEN.format(blocks=blocks), output_cap=CAP, keep_tail=True)
        kinds = [(ev.kind, ev.omitted_bytes) for ev in p.events() if ev.kind == "omitted"]
        r = p.wait(120)
    full = b"".join(hashlib.sha256(str(i).encode()).digest() * 1024 for i in range(blocks))
    assert r.stdout_bytes == total
    assert r.omitted, lacks('outputCapKeep "headAndTail" and process/outputOmitted (protocol.md §5)')
    assert kinds == [("omitted", total - CAP)]
    assert r.stdout[:CAP // 2] == full[:CAP // 2]
    assert r.stdout[CAP // 2:] == full[-(CAP // 2):]
    assert r.dropped_bytes == total - CAP
    if cut:
        assert c.resumes >= 1


def test_binary_writes(target):
    with connect_when_online(target["url"], **target["kw"]) as c:
        assert c.capabilities.get("binaryInput") is True, lacks("binary writes, capabilities.binaryInput (protocol.md §5.2)")
        data = os.urandom(1_000_000)
        r = c.run(["sha256sum"], input=data)
        assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_noise_suite_1(noise_url, relay_url, creds):
    for url in (noise_url, relay_url):
        try:
            c = connect_when_online(url, noise_suite=1, **creds)
        except execrelay.ConnectError as e:
            pytest.fail(lacks(f"Noise suite 1, Noise_IK_25519_AESGCM_BLAKE2s (secure-transport.md §3): {e}"))
        with c:
            assert c.noise_suite == 1
            assert c.run("echo aes").stdout == b"aes\n"
