"""The conformance scenarios: each drives the client through its adapter and checks what the
client reports and what the server saw. The table in README.md lists them with their spec
sections; `runner.py --list` prints the same."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

from runner import Context, Failed, b64, unb64

#: Server flags shared by most scenarios: a short keepalive, so a dead path is found fast
#: and a client that does not answer pings is caught.
KA = ("--keepalive-interval-ms", "300", "--pong-timeout-ms", "1500")
#: The client's keepalive where a scenario needs it to notice a dead path (adapters that
#: cannot set it keep their default, which the scenario's time budget allows for).
CLIENT_KA = {"EXECRELAY_KEEPALIVE_MS": "300", "EXECRELAY_PONG_TIMEOUT_MS": "1500"}
POLICY = ('default = "allow"\n'
          '[[rule]]\nprogram = "echo"\naction = "ask"\nreason = "says things"\n'
          '[[rule]]\nprogram = "rm"\naction = "deny"\n')


@dataclass
class Scenario:
    name: str
    spec: str
    what: str
    fn: Callable[[Context], None]
    #: A server feature the scenario needs that not every server has ("" when none).
    needs: str = ""


SCENARIOS: List[Scenario] = []


def scenario(name: str, spec: str, what: str, needs: str = "") -> Callable:
    def reg(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        SCENARIOS.append(Scenario(name, spec, what, fn, needs))
        return fn
    return reg


def pattern(n: int) -> bytes:
    """The upload pattern every adapter makes for `write_pattern`: byte i is i mod 251."""
    block = bytes(range(251))
    return (block * (n // 251 + 1))[:n]


def gen_cmd(n: int) -> str:
    """A shell command printing `n` bytes the runner can recompute (`expected_gen`)."""
    return (f"python3 -c \"import sys,hashlib\nn={n}; b=hashlib.sha256(b'seed').digest()*2048\n"
            "w=sys.stdout.buffer\nwhile n>0:\n    k=min(n,len(b)); w.write(b[:k]); n-=k\n\"")


def expected_gen(n: int) -> str:
    b = hashlib.sha256(b"seed").digest() * 2048
    h = hashlib.sha256()
    while n > 0:
        k = min(n, len(b))
        h.update(b[:k])
        n -= k
    return h.hexdigest()


def run(a: Any, argv: Any, timeout: float = 120, **opts: Any) -> Dict[str, Any]:
    pid = opts.pop("id", f"p{time.monotonic_ns()}")
    if isinstance(argv, str):
        opts["shell"] = argv
        argv = None
    a.call("start", id=pid, argv=argv, **opts)
    return a.call("wait", id=pid, timeout_ms=int(timeout * 1000), timeout=timeout + 10)


def out(r: Dict[str, Any]) -> bytes:
    return unb64(r.get("stdout_b64"))


def err(r: Dict[str, Any]) -> bytes:
    return unb64(r.get("stderr_b64"))


def _basic(ctx: Context, kind: str) -> None:
    a = ctx.connected(ctx.target(kind, *KA))
    r = run(a, "echo out; echo err >&2; exit 3")
    ctx.check(r.get("exit_code") == 3 and r.get("signal") is None,
              f"exit_code 3, no signal (got {r.get('exit_code')}, {r.get('signal')})")
    ctx.check(out(r) == b"out\n" and err(r) == b"err\n",
              f"stdout 'out\\n', stderr 'err\\n' (got {out(r)!r}, {err(r)!r})")
    ctx.check(r.get("seqs_ok") is not False, "events in seq order without gaps or repeats")
    r = run(a, ["printf", "%s|", "a b", "$HOME"])
    ctx.check(out(r) == b"a b|$HOME|", f"argv passed exactly (got {out(r)!r})")


@scenario("run-ws", "protocol §3, §4", "start and exit over plain ws://")
def run_ws(ctx: Context) -> None:
    _basic(ctx, "ws")


@scenario("run-noise", "secure-transport §3–§5", "start and exit over noise+ws://")
def run_noise(ctx: Context) -> None:
    _basic(ctx, "noise")


@scenario("run-relay", "secure-transport §6", "start and exit through a relay")
def run_relay(ctx: Context) -> None:
    _basic(ctx, "relay")


@scenario("exit-by-signal", "processes §2", "a death by signal is a signal name, no exit code")
def exit_by_signal(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = run(a, "kill -KILL $$")
    ctx.check(r.get("exit_code") is None and r.get("signal") == "SIGKILL",
              f"signal SIGKILL and no exit code (got {r.get('exit_code')}, {r.get('signal')})")


@scenario("env-and-cwd", "protocol §4 process/start", "cwd, env overlay, a removed variable, inheritEnv false")
def env_and_cwd(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = run(a, "pwd; echo $FOO; echo ${HOME:-unset}", cwd="/tmp", env={"FOO": "bar", "HOME": None})
    ctx.check(out(r) == b"/tmp\nbar\nunset\n", f"cwd and env applied (got {out(r)!r})")
    r = run(a, ["/usr/bin/env"], env={"ONLY": "1"}, inherit_env=False)
    ctx.check(out(r) == b"ONLY=1\n", f"inheritEnv false gives exactly env (got {out(r)!r})")


@scenario("stdin-eof", "protocol §4 process/write, closeStdin", "stdin written, then end of file")
def stdin_eof(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    a.call("start", id="c", argv=["sh", "-c", "cat; echo eof"], stdin=True)
    a.call("write", id="c", data_b64=b64(b"hello\n"))
    a.call("close_stdin", id="c")
    r = a.call("wait", id="c", timeout_ms=30000)
    ctx.check(out(r) == b"hello\neof\n", f"stdin then EOF (got {out(r)!r})")
    w = a.request("write", id="c", data_b64=b64(b"late"))
    ctx.check(not w.get("ok") and (w.get("error") or {}).get("type") == "stdin_closed",
              f"a write after exit is a stdin-closed error (got {w})")


@scenario("stdin-large", "protocol §4 process/write (order)", "8 MB of stdin arrive whole and in order")
def stdin_large(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    path = os.path.join(ctx.kit.workdir, "upload-large")
    a.call("start", id="u", argv=["sh", "-c", f"cat > {path}"], stdin=True)
    n = 8 * 1000 * 1000
    a.call("write_pattern", id="u", bytes=n, timeout=120)
    a.call("close_stdin", id="u")
    a.call("wait", id="u", timeout_ms=60000)
    got = hashlib.sha256(open(path, "rb").read()).hexdigest()
    ctx.check(got == hashlib.sha256(pattern(n)).hexdigest(),
              "the server's file has exactly the pattern written")


@scenario("pty", "processes §1 (PTY)", "a tty process's output arrives as the pty stream")
def pty(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = run(a, ["sh", "-c", "tty; echo fine >&2"], tty=True, size=[30, 100])
    ctx.check(b"/dev/pts/" in out(r) and b"fine" in out(r) and err(r) == b"",
              f"stdout and stderr as one pty stream (got {out(r)!r}, {err(r)!r})")
    ctx.check(r.get("streams") in (None, ["pty"]), f"stream named pty (got {r.get('streams')})")


@scenario("pty-resize", "protocol §4 process/resize", "the initial size, then a resize seen by the process")
def pty_resize(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    a.call("start", id="t", argv=["sh", "-c", "stty size; read x; stty size"], tty=True, size=[30, 100])
    a.call("wait_output", id="t", contains_b64=b64(b"30 100"), timeout_ms=20000)
    a.call("resize", id="t", rows=50, cols=132)
    a.call("write", id="t", data_b64=b64(b"\n"))
    r = a.call("wait", id="t", timeout_ms=30000)
    ctx.check(b"30 100" in out(r) and b"50 132" in out(r), f"sizes 30x100 then 50x132 (got {out(r)!r})")


@scenario("signal", "protocol §4 process/signal", "SIGINT reaches the process group")
def signal_(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    a.call("start", id="s", argv=["sleep", "30"])
    a.call("signal", id="s", signal="SIGINT")
    r = a.call("wait", id="s", timeout_ms=30000)
    ctx.check(r.get("signal") == "SIGINT", f"killed by SIGINT (got {r.get('signal')})")


@scenario("terminate-grace", "protocol §4 process/terminate", "SIGTERM ignored, SIGKILL after the grace")
def terminate_grace(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    a.call("start", id="t", shell="trap '' TERM; echo ready; sleep 30")
    a.call("wait_output", id="t", contains_b64=b64(b"ready"), timeout_ms=20000)
    t = a.call("terminate", id="t", grace_ms=200)
    ctx.check(t.get("running") is True, f"terminate says it was running (got {t})")
    r = a.call("wait", id="t", timeout_ms=30000)
    ctx.check(r.get("signal") == "SIGKILL", f"SIGKILL after the grace (got {r.get('signal')})")


def _reason(ctx: Context, r: Dict[str, Any], want: str) -> None:
    ctx.check(r.get("reason") == want and r.get("reason_from_server") is not False,
              f"the server's exit notice says reason {want!r} "
              f"(got {r.get('reason')!r}, from the server: {r.get('reason_from_server')})")


@scenario("reason-exited", "protocol §5 reason", "reason exited, also for a signal nobody here sent",
          needs="reason in process/exited")
def reason_exited(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    _reason(ctx, run(a, "exit 4"), "exited")
    _reason(ctx, run(a, "kill -TERM $$"), "exited")


@scenario("reason-timeout", "protocol §4 timeoutMs, §5 reason", "timeoutMs ends it: timedOut and reason timeout",
          needs="reason in process/exited")
def reason_timeout(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = run(a, ["sleep", "30"], timeout_ms=300)
    ctx.check(r.get("timed_out") is True, f"timedOut (got {r.get('timed_out')})")
    _reason(ctx, r, "timeout")


@scenario("reason-terminated", "protocol §5 reason", "process/terminate and process/signal: reason terminated",
          needs="reason in process/exited")
def reason_terminated(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    a.call("start", id="t", argv=["sleep", "30"])
    a.call("terminate", id="t", grace_ms=200)
    _reason(ctx, a.call("wait", id="t", timeout_ms=30000), "terminated")


@scenario("start-error-program", "protocol §2 -32007", "a missing program: a start error (program, ENOENT, 127)",
          needs="the -32007 start error")
def start_error_program(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    r = a.request("start", id="x", argv=["nosuchprog-xyz"])
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "start", f"a start error (got {r})")
    ctx.check(e.get("code") == -32007, f"code -32007 (got {e.get('code')})")
    ctx.check((e.get("what"), e.get("errno")) == ("program", "ENOENT"),
              f"what program, errno ENOENT (got {e.get('what')}, {e.get('errno')})")
    ok = run(a, "echo still")
    ctx.check(out(ok) == b"still\n", "the session goes on after a failed start")


@scenario("start-error-cwd", "protocol §2 -32007", "a missing directory is told apart from a missing program",
          needs="the -32007 start error")
def start_error_cwd(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = a.request("start", id="x", argv=["true"], cwd="/nonexistent-dir-xyz")
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "start", f"a start error (got {r})")
    ctx.check((e.get("code"), e.get("what"), e.get("path")) == (-32007, "cwd", "/nonexistent-dir-xyz"),
              f"-32007 with what cwd and its path (got {e})")


@scenario("binary-output", "protocol §5.1", "binary output negotiated; every byte value exact")
def binary_output(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    caps = a.call("capabilities").get("capabilities")
    ctx.check(caps is None or caps.get("binaryOutput") is True,
              f"the client says binaryOutput was negotiated (got {caps})")
    ctx.check(ctx.server_output_form(a.session) is True,
              "the server sends this session binary output (its log)")
    r = run(a, "i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done")
    ctx.check(out(r) == bytes(range(256)), f"bytes 0..255 exact (got {len(out(r))} bytes)")


@scenario("json-output", "protocol §1 base64, §5.1", "JSON output with base64 when binary is not asked")
def json_output(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA), EXECRELAY_BINARY="0")
    caps = a.call("capabilities").get("capabilities")
    ctx.check(caps is None or caps.get("binaryOutput") is False,
              f"the client says binaryOutput false (got {caps})")
    ctx.check(ctx.server_output_form(a.session) is False,
              "the server sends this session JSON output (its log)")
    r = run(a, "printf '\\000\\001\\377'; printf e >&2")
    ctx.check(out(r) == b"\x00\x01\xff" and err(r) == b"e", f"bytes exact (got {out(r)!r})")


@scenario("binary-writes", "protocol §5.2", "binary writes negotiated; an upload arrives exact",
          needs="binary writes (capabilities.binaryInput)")
def binary_writes(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    caps = a.call("capabilities").get("capabilities") or {}
    ctx.check(caps.get("binaryInput") is True,
              f"binaryInput negotiated, as the client reports it (got {caps})")
    path = os.path.join(ctx.kit.workdir, "upload-binary")
    a.call("start", id="u", argv=["sh", "-c", f"cat > {path}"], stdin=True)
    a.call("write_pattern", id="u", bytes=3_000_000, timeout=60)
    a.call("close_stdin", id="u")
    a.call("wait", id="u", timeout_ms=60000)
    ctx.check(open(path, "rb").read() == pattern(3_000_000), "the upload arrived exact")


#: Each byte budget of the tight server of `refused-write-retry`: one large write fits, two
#: do not (its `maxMessageBytes` too, so a JSON write must be cut to fit it).
TIGHT = "90112"


def _limit_refusals(metrics_url: str) -> Dict[str, float]:
    """`execrelay_limit_refusals_total` by limit, from the server's `/metrics`."""
    import re
    import urllib.request
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^execrelay_limit_refusals_total\{limit="([^"]+)"\} (\S+)$', text, re.M)}


@scenario("refused-write-retry", "README decision (retryRefusedWrites), protocol §4 writeId",
          "a write refused for a full budget is sent again; the upload arrives whole, in order",
          needs="capabilities.retryRefusedWrites")
def refused_write_retry(ctx: Context) -> None:
    srv = ctx.servers.ws("--max-message-bytes", TIGHT, "--max-pending-request-bytes", TIGHT,
                         "--max-inbound-bytes", TIGHT, "--metrics-listen", "127.0.0.1:0", *KA)
    a = ctx.connected({"EXECRELAY_TARGET": srv.url, "EXECRELAY_SERVER_KEY": "",
                       "EXECRELAY_KEY": ""})
    caps = a.call("capabilities").get("capabilities") or {}
    ctx.check(caps.get("retryRefusedWrites") is True,
              f"the server promises the order (got {caps.get('retryRefusedWrites')})")
    metrics = ""
    deadline = time.monotonic() + 30
    while not metrics:
        import re
        m = re.search(r"execrelay metrics: (http://\S+/metrics)", srv.log())
        metrics = m.group(1) if m else ""
        ctx.check(bool(metrics) or time.monotonic() < deadline, "the server's metrics URL")
        time.sleep(0.02)
    # The child reads nothing until the FIFO is written: its first write fills its pipe, the
    # second waits there with its charge, the third finds the budget full and is refused.
    fifo = os.path.join(ctx.kit.workdir, "refused-write-go")
    os.mkfifo(fifo)
    path = os.path.join(ctx.kit.workdir, "upload-refused")
    a.call("start", id="u", argv=["sh", "-c", f'read -r _ < "{fifo}"; exec cat > "{path}"'],
           stdin=True)
    n = 2_000_000
    a.send("write_pattern", id="u", bytes=n)
    budgets = ("maxPendingRequestBytes", "maxInboundBytes")
    while sum(_limit_refusals(metrics).get(k, 0) for k in budgets) < 1:
        ctx.check(time.monotonic() < deadline + 30, "the server refused a write for its budget")
        time.sleep(0.02)
    with open(fifo, "w") as f:
        f.write("go\n")
    r = a.reply("write_pattern", timeout=120)
    ctx.check(bool(r.get("ok")), f"the upload went on after the refusal (got {r.get('error')})")
    a.call("close_stdin", id="u")
    a.call("wait", id="u", timeout_ms=60000)
    ctx.check(open(path, "rb").read() == pattern(n), "the upload arrived whole and in order")


def _metrics_url(ctx: Context, srv: Any) -> str:
    """The `/metrics` URL a server started with `--metrics-listen` logged."""
    import re
    deadline = time.monotonic() + 30
    while True:
        m = re.search(r"execrelay metrics: (http://\S+/metrics)", srv.log())
        if m:
            return m.group(1)
        ctx.check(time.monotonic() < deadline, "the server's metrics URL")
        time.sleep(0.02)


@scenario("refused-start-retry", "README decision (a refused start is tried again)",
          "a start refused while another client's upload fills the server's budget goes once it moves")
def refused_start_retry(ctx: Context) -> None:
    srv = ctx.servers.ws("--max-message-bytes", TIGHT, "--max-pending-request-bytes", TIGHT,
                         "--max-inbound-bytes", TIGHT, "--metrics-listen", "127.0.0.1:0", *KA)
    env = {"EXECRELAY_TARGET": srv.url, "EXECRELAY_SERVER_KEY": "", "EXECRELAY_KEY": ""}
    metrics = _metrics_url(ctx, srv)
    a = ctx.connected(dict(env))
    b = ctx.connected(dict(env))
    # A's child reads nothing until the FIFO is written: its upload holds the server-wide
    # budget (`maxInboundBytes`) until then.
    fifo = os.path.join(ctx.kit.workdir, "refused-start-go")
    os.mkfifo(fifo)
    a.call("start", id="h", argv=["sh", "-c", f'read -r _ < "{fifo}"; exec cat > /dev/null'],
           stdin=True)
    a.send("write_pattern", id="h", bytes=2_000_000)
    # A's own connection budget refuses A's next write; the server-wide one, B's start.
    deadline = time.monotonic() + 60
    while _limit_refusals(metrics).get("maxPendingRequestBytes", 0) < 1:
        ctx.check(time.monotonic() < deadline, "the server refused a write of A for its budget")
        time.sleep(0.02)
    before = _limit_refusals(metrics).get("maxInboundBytes", 0)
    # B's start carries an argument that does not fit beside the held write.
    b.send("start", id="late", argv=["sh", "-c", "echo started", "x" * 40_000])
    while _limit_refusals(metrics).get("maxInboundBytes", 0) <= before:
        ctx.check(time.monotonic() < deadline, "the server refused B's start for its budget")
        time.sleep(0.02)
    with open(fifo, "w") as f:
        f.write("go\n")
    r = b.reply("start", timeout=60)
    ctx.check(bool(r.get("ok")), f"the start went once the upload moved (got {r.get('error')})")
    if r.get("ok"):
        w = b.call("wait", id="late", timeout_ms=60000)
        ctx.check(out(w) == b"started\n" and w.get("exit_code") == 0,
                  f"it ran, once (got {out(w)!r}, exit {w.get('exit_code')})")
    r = a.reply("write_pattern", timeout=120)
    ctx.check(bool(r.get("ok")), f"A's upload went on (got {r.get('error')})")


@scenario("oversized-request", "protocol §3 limits.maxMessageBytes",
          "a start larger than the server reads is refused by the client; the connection goes on")
def oversized_request(ctx: Context) -> None:
    srv = ctx.servers.ws("--max-message-bytes", TIGHT, *KA)
    a = ctx.connected({"EXECRELAY_TARGET": srv.url, "EXECRELAY_SERVER_KEY": "",
                       "EXECRELAY_KEY": ""})
    r = a.request("start", id="big", argv=["true", "x" * (int(TIGHT) + 1)], timeout=30)
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "request_too_large",
              f"refused as too large (got {r})")
    ctx.check(e.get("limit") == int(TIGHT), f"the limit named: {TIGHT} (got {e.get('limit')})")
    ok = run(a, "echo still")
    ctx.check(out(ok) == b"still\n", "the session goes on")


@scenario("unfit-start", "README decision (a refused start is tried again)",
          "a start the server's byte budget can never hold (many short arguments) is reported at its first refusal")
def unfit_start(ctx: Context) -> None:
    srv = ctx.servers.ws("--max-message-bytes", TIGHT, "--max-pending-request-bytes", TIGHT,
                         "--metrics-listen", "127.0.0.1:0", *KA)
    metrics = _metrics_url(ctx, srv)
    a = ctx.connected({"EXECRELAY_TARGET": srv.url, "EXECRELAY_SERVER_KEY": "",
                       "EXECRELAY_KEY": ""})
    # 2,000 one-letter arguments: about 8 KB of text, under maxMessageBytes, but the server
    # charges 128 bytes more per value (about 264 KB), over the budget whatever else is in
    # flight. Counted by its text, it looked as if it would fit and went again for a minute.
    before = _limit_refusals(metrics).get("maxPendingRequestBytes", 0)
    r = a.request("start", id="unfit", argv=["true"] + ["a"] * 2000, timeout=50)
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "rpc" and e.get("code") == -32004,
              f"refused with -32004 (got {r})")
    refusals = _limit_refusals(metrics).get("maxPendingRequestBytes", 0) - before
    ctx.check(refusals == 1, f"sent once, not again (the server refused it {refusals:.0f} times)")
    ok = run(a, "echo still")
    ctx.check(out(ok) == b"still\n", "the session goes on")


@scenario("output-cap", "protocol §4 outputBytesCap", "a capped stream: first bytes kept, the rest counted")
def output_cap(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA))
    r = run(a, "head -c 100000 /dev/zero", output_cap=1000)
    ctx.check(r.get("stdout_len") == 1000 and r.get("dropped_bytes") == 99000,
              f"1000 delivered, 99000 dropped (got {r.get('stdout_len')}, {r.get('dropped_bytes')})")


@scenario("output-head-and-tail", "protocol §5 outputCapKeep", "headAndTail: head live, omitted notice, tail",
          needs="outputCapKeep headAndTail")
def head_and_tail(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    n, cap = 5_000_000, 1 << 20
    r = run(a, gen_cmd(n), output_cap=cap, keep_tail=True)
    b = hashlib.sha256(b"seed").digest() * 2048
    full = (b * (n // len(b) + 1))[:n]
    ctx.check(r.get("omitted") == [["stdout", n - cap]], f"one omitted notice of {n - cap} (got {r.get('omitted')})")
    ctx.check(out(r) == full[:cap // 2] + full[-(cap // 2):], "head and tail exact")


def _cut_output(ctx: Context, kind: str) -> None:
    env = ctx.target(kind, *KA)
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    n = 30 * 1000 * 1000
    proxy.cut_after_down(6_000_000, times=2)
    r = run(a, gen_cmd(n), timeout=180)
    ctx.check(proxy.cuts == 2, f"the link was cut twice during output (cut {proxy.cuts} times)")
    ctx.check(r.get("exit_code") == 0, f"exit 0 (got {r.get('exit_code')})")
    ctx.check(r.get("stdout_len") == n and r.get("stdout_sha256") == expected_gen(n),
              f"all {n} bytes, none repeated (got {r.get('stdout_len')}, sha match "
              f"{r.get('stdout_sha256') == expected_gen(n)})")
    ctx.check(r.get("seqs_ok") is not False, "seq order kept across the resumes")
    ctx.check(proxy.connections >= 3, f"the client reconnected (connections {proxy.connections})")


@scenario("cut-during-output-ws", "processes §4–§5, protocol §3 resume", "link cut twice during 30 MB over ws://")
def cut_ws(ctx: Context) -> None:
    _cut_output(ctx, "ws")


@scenario("cut-during-output-noise", "secure-transport §7, protocol §3", "link cut twice during 30 MB over noise+ws://")
def cut_noise(ctx: Context) -> None:
    _cut_output(ctx, "noise")


@scenario("cut-during-output-relay", "secure-transport §6–§7", "client link cut twice during 30 MB through the relay")
def cut_relay(ctx: Context) -> None:
    _cut_output(ctx, "relay")


@scenario("cut-during-write", "protocol §4 writeId, §3 resume", "link cut during a 6 MB upload: nothing lost or repeated")
def cut_write(ctx: Context) -> None:
    env = ctx.target("noise", *KA)
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    path = os.path.join(ctx.kit.workdir, "upload-cut")
    a.call("start", id="u", argv=["sh", "-c", f"cat > {path}"], stdin=True)
    n = 6_000_000
    proxy.cut_after_up(2_000_000)
    a.call("write_pattern", id="u", bytes=n, timeout=120)
    a.call("close_stdin", id="u")
    a.call("wait", id="u", timeout_ms=60000)
    ctx.check(proxy.cuts == 1, f"the link was cut during the write (cuts {proxy.cuts})")
    data = open(path, "rb").read()
    ctx.check(len(data) == n and data == pattern(n),
              f"the server wrote exactly the {n} bytes sent (got {len(data)})")


@scenario("keepalive-silent", "secure-transport §6.4", "a process silent longer than the pong timeout keeps its link")
def keepalive_silent(ctx: Context) -> None:
    env = ctx.target("noise", *KA)
    proxy = ctx.proxy(env)
    a = ctx.connected(env)
    r = run(a, "sleep 4; echo awake")
    ctx.check(out(r) == b"awake\n", f"output after the silence (got {out(r)!r})")
    ctx.check(proxy.connections == 1, f"one connection: the client answered pings (got {proxy.connections})")


@scenario("keepalive-dead-path", "secure-transport §6.4", "a path that goes silent is found dead and the session resumed")
def keepalive_dead(ctx: Context) -> None:
    env = ctx.target("noise", *KA)
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    a.call("start", id="k", shell="echo one; sleep 6; echo two")
    a.call("wait_output", id="k", contains_b64=b64(b"one"), timeout_ms=20000)
    proxy.blackhole(True)  # the current connection only: new ones flow
    r = a.call("wait", id="k", timeout_ms=90000, timeout=100)
    ctx.check(out(r) == b"one\ntwo\n", f"all output once (got {out(r)!r})")
    ctx.check(proxy.connections >= 2, f"the client opened a new connection (got {proxy.connections})")


@scenario("eviction", "protocol §3 resume (evict)", "a resume while the old connection is half-open evicts it")
def eviction(ctx: Context) -> None:
    # The server's keepalive is the default (15 s / 30 s): it still holds the half-open
    # connection when the client, with a short keepalive, resumes on a new one.
    env = ctx.target("noise")
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    a.call("start", id="e", shell="echo one; sleep 5; echo two")
    a.call("wait_output", id="e", contains_b64=b64(b"one"), timeout_ms=20000)
    proxy.blackhole(True)
    r = a.call("wait", id="e", timeout_ms=90000, timeout=100)
    ctx.check(out(r) == b"one\ntwo\n", f"all output once (got {out(r)!r})")
    ctx.check(proxy.connections >= 2, "the client resumed on a new connection")
    logs = "".join(p.log() for p in ctx.servers.procs)
    ctx.check("end=Evicted" in logs, "the server evicted the half-open connection (its log says end=Evicted)")


@scenario("window-credit", "secure-transport §7 (receive)", "20 MB over a Noise stream: the client returns credit as it consumes")
def window_credit(ctx: Context) -> None:
    a = ctx.connected(ctx.target("noise", *KA))
    n = 20 * 1000 * 1000
    r = run(a, gen_cmd(n), timeout=180)
    ctx.check(r.get("stdout_len") == n and r.get("stdout_sha256") == expected_gen(n),
              "every byte arrived: the server never waited forever for credit")


@scenario("window-send", "secure-transport §7 (send)", "a 6 MB upload through the relay stays inside the window")
def window_send(ctx: Context) -> None:
    a = ctx.connected(ctx.target("relay", *KA))
    path = os.path.join(ctx.kit.workdir, "upload-window")
    a.call("start", id="u", argv=["sh", "-c", f"cat > {path}"], stdin=True)
    a.call("write_pattern", id="u", bytes=6_000_000, timeout=120)
    a.call("close_stdin", id="u")
    a.call("wait", id="u", timeout_ms=60000)
    ctx.check(open(path, "rb").read() == pattern(6_000_000), "the upload arrived exact")
    logs = "".join(p.log() for p in ctx.servers.procs)
    ctx.check("window_exceeded" not in logs, "no stream was reset for exceeding its window")


def _policy_target(ctx: Context, kind: str) -> Dict[str, str]:
    path = ctx.servers.write_file("conformance-policy.toml", POLICY)
    return ctx.target(kind, *KA, "--exec-policy", path)


@scenario("approval-approved", "protocol §7", "the server asks; the client approves; it runs")
def approval_approved(ctx: Context) -> None:
    a = ctx.connected(_policy_target(ctx, "noise"), EXECRELAY_APPROVE="yes")
    r = run(a, ["echo", "hi"])
    ctx.check(out(r) == b"hi\n", f"it ran (got {out(r)!r})")
    asked = a.call("approvals").get("approvals") or []
    ctx.check(len(asked) == 1 and asked[0].get("argv") == ["echo", "hi"]
              and asked[0].get("rule") == "says things",
              f"asked once with argv and rule (got {asked})")


@scenario("approval-denied", "protocol §7", "the client denies: -32006, nothing runs")
def approval_denied(ctx: Context) -> None:
    a = ctx.connected(_policy_target(ctx, "ws"), EXECRELAY_APPROVE="no")
    r = a.request("start", id="d", argv=["echo", "no"])
    ctx.check(not r.get("ok") and (r.get("error") or {}).get("type") == "not_approved",
              f"not approved (got {r})")


@scenario("approval-no-handler", "protocol §7", "a client that cannot answer is denied")
def approval_no_handler(ctx: Context) -> None:
    a = ctx.connected(_policy_target(ctx, "ws"))
    r = a.request("start", id="d", argv=["echo", "no"])
    ctx.check(not r.get("ok") and (r.get("error") or {}).get("type") == "not_approved",
              f"not approved (got {r})")


@scenario("approval-replayed", "protocol §7 (resume)", "the link dies while a question is pending: asked again with the same id, answered once")
def approval_replayed(ctx: Context) -> None:
    env = _policy_target(ctx, "noise")
    proxy = ctx.proxy(env)
    a = ctx.connected(env, EXECRELAY_APPROVE="yes", EXECRELAY_APPROVE_DELAY_MS="700", **CLIENT_KA)
    a.send("start", id="r", argv=["echo", "after"])
    r = a.reply("start", on_event=lambda ev: proxy.cut() if ev.get("event") == "approval" else None)
    if not r.get("ok"):
        raise Failed(f"start failed: {r.get('error')}")
    w = a.call("wait", id="r", timeout_ms=30000)
    ctx.check(out(w) == b"after\n", f"it ran once approved (got {out(w)!r})")
    ctx.check(proxy.cuts == 1 and proxy.connections >= 2,
              f"the link was cut while the question was pending (cuts {proxy.cuts}, connections {proxy.connections})")
    asked = a.call("approvals").get("approvals") or []
    ids = [q.get("id") for q in asked]
    ctx.check(len(asked) == 1, f"the application was asked once (asked {ids})")


@scenario("refused-key", "secure-transport §2, §8", "a key not in authorized_keys: refused, naming the key")
def refused_key(ctx: Context) -> None:
    env = ctx.target("noise", *KA)
    env["EXECRELAY_KEY"] = ctx.servers.other_key
    a = ctx.adapter(env)
    r = a.request("connect")
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "refused" and e.get("what") == "key",
              f"refused, what=key (got {r})")


@scenario("wrong-server-key", "secure-transport §3", "a pinned key that is not the server's: refused, naming the server key")
def wrong_server_key(ctx: Context) -> None:
    env = ctx.target("relay", *KA)
    env["EXECRELAY_SERVER_KEY"] = ctx.servers.other_key + ".pub"
    deadline = time.monotonic() + 30
    while True:
        a = ctx.adapter(env)
        r = a.request("connect")
        e = r.get("error") or {}
        if "offline" in str(e) and time.monotonic() < deadline:
            a.close()
            time.sleep(0.2)
            continue
        break
    ctx.check(not r.get("ok") and e.get("type") == "refused" and e.get("what") == "server_key",
              f"refused, what=server_key (got {r})")


@scenario("session-ttl", "protocol §3 sessionTtlMs", "a client asks for a longer detached TTL and gets it",
          needs="sessionTtlMs")
def session_ttl(ctx: Context) -> None:
    a = ctx.connected(ctx.target("ws", *KA), EXECRELAY_SESSION_TTL_MS="600000")
    lim = a.call("capabilities").get("limits") or {}  # a client without a TTL option fails at connect
    ctx.check(lim.get("detachedSessionTtlMs") == 600000, f"600000 granted (got {lim.get('detachedSessionTtlMs')})")


@scenario("noise-suite-aesgcm", "secure-transport §3 suites", "suite 1 (AESGCM) pinned: handshake and records",
          needs="Noise suite 1 (AESGCM)")
def suite_aes(ctx: Context) -> None:
    a = ctx.adapter(ctx.target("noise", *KA), EXECRELAY_NOISE_SUITE="1")
    r = a.request("connect")
    ctx.check(bool(r.get("ok")), f"connected with suite 1 (got {r.get('error')})")
    r = run(a, "echo aes")
    ctx.check(out(r) == b"aes\n", "records of suite 1 carry output")


@scenario("hundred-processes", "processes §6", "100 processes of one session at once, each its own output")
def hundred(ctx: Context) -> None:
    a = ctx.connected(ctx.target("relay", *KA))
    for i in range(100):
        a.call("start", id=f"h{i}", shell=f"sleep 0.5; echo {i}")
    for i in range(100):
        r = a.call("wait", id=f"h{i}", timeout_ms=60000)
        if out(r) != f"{i}\n".encode():
            raise Failed(f"process {i}: got {out(r)!r}")
    ctx.check(True, "100 outputs, each to its process")


@scenario("resume-after-server-side-drop", "processes §5 (detach, resume)", "the server drops the connection (idle policy aside): the client resumes")
def server_side_drop(ctx: Context) -> None:
    env = ctx.target("relay", *KA)
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    a.call("start", id="d", shell="echo one; sleep 1; echo two; sleep 1; echo three")
    a.call("wait_output", id="d", contains_b64=b64(b"one"), timeout_ms=20000)
    proxy.cut()
    r = a.call("wait", id="d", timeout_ms=60000)
    ctx.check(out(r) == b"one\ntwo\nthree\n", f"every line once (got {out(r)!r})")


@scenario("reason-server-shutdown", "processes §5 (shutdown), protocol §5 reason",
          "a server shutting down delivers exit notices with reason serverShutdown",
          needs="reason in process/exited")
def reason_server_shutdown(ctx: Context) -> None:
    server = ctx.servers.ws(*KA)  # its own server: this scenario stops it
    env = {"EXECRELAY_TARGET": server.url, "EXECRELAY_SERVER_KEY": "", "EXECRELAY_KEY": ""}
    a = ctx.connected(env)
    a.call("start", id="s", shell="echo up; sleep 30")
    a.call("wait_output", id="s", contains_b64=b64(b"up"), timeout_ms=20000)
    import signal
    import threading
    threading.Thread(target=lambda: server.stop(signal.SIGTERM, 30), daemon=True).start()
    r = a.request("wait", id="s", timeout_ms=40000, timeout=50)
    ctx.check(bool(r.get("ok")), f"the exit notice arrived before the server went (got {r.get('error')})")
    ctx.check(r.get("signal") == "SIGTERM", f"terminated by SIGTERM (got {r.get('signal')})")
    _reason(ctx, r, "serverShutdown")


@scenario("session-lost-after-ttl", "processes §5 (expiry), protocol §3 -32003",
          "a client that cannot come back within the session's TTL reports the session lost")
def session_lost(ctx: Context) -> None:
    env = ctx.target("ws", *KA, "--detached-session-ttl-ms", "1500")
    proxy = ctx.proxy(env)
    a = ctx.connected(env, **CLIENT_KA)
    a.call("start", id="l", shell="echo up; sleep 30")
    a.call("wait_output", id="l", contains_b64=b64(b"up"), timeout_ms=20000)
    proxy.refuse(True)
    proxy.cut()
    r = a.request("wait", id="l", timeout_ms=60000, timeout=70)
    e = r.get("error") or {}
    ctx.check(not r.get("ok") and e.get("type") == "session_lost",
              f"a session-lost error, not a hang or an exit (got {r})")
