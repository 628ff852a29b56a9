"""The client's behaviour on every transport (ws://, noise+ws://, relay+ws://)."""

from __future__ import annotations

import os

import pytest

import execrelay


def test_run_shell_string_and_argv(client):
    r = client.run("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (3, None, b"out\n", b"err\n")
    with pytest.raises(execrelay.CommandError, match="exited with status 3"):
        r.check()
    r = client.run(["printf", "%s|", "a b", "$HOME", "'q'"])
    assert r.stdout == b"a b|$HOME|'q'|"
    assert r.check() is r


def test_cwd_and_env(client, tmp_path):
    r = client.run("pwd; echo $FOO; echo ${HOME:-unset}", cwd=str(tmp_path),
                   env={"FOO": "bar", "HOME": None})
    assert r.stdout == f"{tmp_path}\nbar\nunset\n".encode()
    r = client.run(["/usr/bin/env"], inherit_env=False, env={"ONLY": "1"})
    assert r.stdout == b"ONLY=1\n"


def test_stdin_and_eof(client):
    p = client.start(["sh", "-c", "wc -c; echo closed"], stdin=True)
    data = os.urandom(700_000)  # several chunks
    p.write(data)
    p.close_stdin()
    r = p.wait()
    assert r.stdout == f"{len(data)}\nclosed\n".encode()
    with pytest.raises(execrelay.StdinClosed):
        p.write(b"late")
    r = client.run(["sha256sum"], input=data)
    import hashlib
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_binary_output_bytes_exact(client):
    r = client.run(["head", "-c", "300000", "/dev/urandom"])
    assert len(r.stdout) == 300000 and r.stdout_bytes == 300000


def test_json_output_when_binary_is_off(target):
    from conftest import connect_when_online
    with connect_when_online(target["url"], binary=False, **target["kw"]) as c:
        assert c.capabilities.get("binaryOutput") is False
        r = c.run("printf '\\000\\001\\377'; printf e >&2")
        assert r.stdout == b"\x00\x01\xff" and r.stderr == b"e"


def test_binary_output_negotiated(client):
    assert client.capabilities.get("binaryOutput") is True
    assert client.capabilities.get("acks") is True


def test_tty_and_resize(client):
    p = client.start(["sh", "-c", "stty size; read x; stty size"], tty=True, size=(30, 100))
    evs = []
    it = p.events()
    for ev in it:
        evs.append(ev)
        if b"30 100" in b"".join(e.data for e in evs):
            break
    p.resize(50, 132)
    p.write(b"\n")
    rest = list(it)
    out = b"".join(e.data for e in evs + rest)
    assert all(e.kind in ("pty", "exit") for e in evs + rest)
    assert b"30 100" in out and b"50 132" in out
    assert rest[-1].kind == "exit" and rest[-1].result.exit_code == 0


def test_signals_and_terminate(client):
    p = client.start(["sleep", "30"])
    assert p.pid > 0
    p.signal("SIGINT")
    r = p.wait(30)
    assert (r.exit_code, r.signal, r.reason) == (None, "SIGINT", "terminated")
    p = client.start("trap '' TERM; echo ready; sleep 30")
    for ev in p.events():  # the trap is set once it said so
        if ev.kind == "stdout":
            assert ev.data == b"ready\n"
            break
    assert p.terminate(grace=0.2) is True
    r = p.wait(30)
    assert r.signal == "SIGKILL" and r.reason == "terminated"


def test_timeout_reason(client):
    r = client.run(["sleep", "30"], timeout=0.3)
    assert r.timed_out and r.signal == "SIGTERM" and r.reason == "timeout"


def test_output_cap(client):
    r = client.run("head -c 100000 /dev/zero", output_cap=1000)
    assert len(r.stdout) == 1000 and r.dropped_bytes == 99000 and r.stdout_bytes == 100000


def test_events_in_order_once(client):
    p = client.start("for i in $(seq 1 200); do echo $i; echo e$i >&2; done")
    seqs, out, err = [], b"", b""
    for ev in p.events():
        seqs.append(ev.seq)
        if ev.kind == "stdout":
            out += ev.data
        elif ev.kind == "stderr":
            err += ev.data
    assert seqs == list(range(1, len(seqs) + 1))
    assert out == b"".join(b"%d\n" % i for i in range(1, 201))
    assert err == b"".join(b"e%d\n" % i for i in range(1, 201))


def test_missing_program_and_directory(client, tmp_path):
    with pytest.raises(execrelay.StartError) as e:
        client.run(["nosuchprog-xyz"])
    assert e.value.what == "program" and e.value.errno == "ENOENT" and e.value.exit_code == 127
    # The client's sessions go on.
    assert client.run("echo still").stdout == b"still\n"
    with pytest.raises(execrelay.StartError) as e:
        client.run(["true"], cwd=str(tmp_path / "missing"))
    assert e.value.errno == "ENOENT"


def test_list_and_info(client):
    p = client.start(["sleep", "30"])
    listed = {e["processId"]: e for e in client.list()}
    assert listed[p.id]["state"] == "running" and listed[p.id]["pid"] == p.pid
    info = client.server_info()
    assert info["protocolVersion"] == 1
    p.terminate(grace=0.1)
    p.wait(30)


def test_silent_process_survives_keepalive(client):
    # The servers ping every 0.3 s and give up after 1 s: a client that answers keeps its link.
    r = client.run("sleep 2.5; echo awake")
    assert r.stdout == b"awake\n"
    assert client.resumes == 0


def test_wait_timeout_leaves_the_process_running(client):
    p = client.start(["sleep", "30"])
    with pytest.raises(TimeoutError, match="still running"):
        p.wait(0.2)
    assert {e["processId"]: e["state"] for e in client.list()}[p.id] == "running"
    p.terminate(grace=0.1)
    assert p.wait(30).signal == "SIGTERM"


def test_a_relay_window_below_ours_slows_the_stream_and_stalls_nothing(servers, creds):
    """Our window (32 records) above a relay's smallest (8): the relay passes on 8, and we
    acknowledge every 8 records, so the output flows (it stalled when we acknowledged only
    every half window, 16, which a sender held to 8 never reaches)."""
    import threading

    from conftest import KEEPALIVE, connect_when_online

    relay = servers.relay("--max-window-records", "8")
    env = servers.environment(relay.url, *KEEPALIVE)
    c = connect_when_online(env.url, **creds)
    got = {}

    def run():
        got["r"] = c.run(["head", "-c", "3000000", "/dev/zero"])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)  # hang guard: a stalled stream never ends
    assert not t.is_alive(), "the output stalled behind the relay's window"
    assert (got["r"].exit_code, len(got["r"].stdout)) == (0, 3000000)
    assert got["r"].stdout == bytes(3000000)
    c.close()
