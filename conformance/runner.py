#!/usr/bin/env python3
"""The conformance runner: real servers, a fault proxy, and the client under test driven
through its adapter (see README.md for the adapter protocol and the scenario table).

Standard library only. `run.sh ADAPTER_CMD…` calls it; by hand:

    python3 conformance/runner.py --adapter "python3 conformance/adapters/python/adapter.py" \
        [--only NAME[,NAME…]] [--report conformance-report.json] [--name python]

Prints one line per scenario, then `N passed, M failed`, and writes the JSON report. Exit
status 0 when every scenario passed, 1 otherwise, 2 when the kit itself could not run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fault_proxy import FaultProxy  # noqa: E402
from servers import ServerError, Servers  # noqa: E402

#: How long one adapter reply may take (hang guard); a scenario may ask for more.
REPLY_TIMEOUT = 60.0
#: Whole-scenario hang guard.
SCENARIO_TIMEOUT = 240.0


class Failed(Exception):
    """A check failed; the message says what was expected and what was seen."""


class Adapter:
    """The client under test: one adapter process per scenario, JSON lines both ways."""

    def __init__(self, cmd: List[str], env: Dict[str, str], log_path: str) -> None:
        full = dict(os.environ)
        full.update(env)
        self.log = open(log_path, "wb")
        from servers import _spawn
        self.p = _spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=self.log, env=full, start_new_session=True)
        self.lines: "queue.Queue[Optional[dict]]" = queue.Queue()
        self.events: List[dict] = []
        self.session: Optional[str] = None
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = {"ok": False, "error": {"type": "adapter",
                                              "message": f"not JSON: {raw[:200]!r}"}}
            self.lines.put(obj)
        self.lines.put(None)

    def send(self, op: str, **args: Any) -> None:
        msg = dict(args)
        msg["op"] = op
        assert self.p.stdin is not None
        try:
            self.p.stdin.write((json.dumps(msg) + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise Failed(f"the adapter exited before `{op}` (status {self.p.poll()})") from None

    def reply(self, op: str = "", timeout: float = REPLY_TIMEOUT,
              on_event: Any = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failed(f"no reply to `{op}` within {timeout:g} s")
            try:
                obj = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if obj is None:
                self.lines.put(None)
                raise Failed(f"the adapter exited (status {self.p.poll()}) before replying to `{op}`")
            if "event" in obj:
                self.events.append(obj)
                if on_event is not None:
                    on_event(obj)
                continue
            return obj

    def call(self, op: str, timeout: float = REPLY_TIMEOUT, **args: Any) -> dict:
        """Send `op` and return its reply, which must be ok."""
        r = self.request(op, timeout=timeout, **args)
        if not r.get("ok"):
            raise Failed(f"`{op}` failed: {json.dumps(r.get('error'))}")
        return r

    def request(self, op: str, timeout: float = REPLY_TIMEOUT, **args: Any) -> dict:
        """Send `op` and return its reply, ok or not."""
        self.send(op, **args)
        return self.reply(op, timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.send("close")
            self.reply("close", timeout=10)
        except Failed:
            pass
        try:
            if self.p.stdin:
                self.p.stdin.close()
            self.p.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            self.p.kill()
            self.p.wait(5)
        self.log.close()


class Context:
    """What a scenario has: the servers (started on demand), proxies and its adapter."""

    def __init__(self, kit: "Kit", name: str) -> None:
        self.kit = kit
        self.name = name
        self.adapters: List[Adapter] = []
        self.proxies: List[FaultProxy] = []
        self.checks: List[str] = []

    @property
    def servers(self) -> Servers:
        return self.kit.servers

    def target(self, kind: str, *extra: str) -> Dict[str, str]:
        """Connection details for a server of `kind` (ws, noise, relay) started with
        `extra` flags (shared between scenarios that ask for the same)."""
        url = self.kit.server_url(kind, extra)
        env = {"EXECRELAY_TARGET": url, "EXECRELAY_SERVER_KEY": "", "EXECRELAY_KEY": ""}
        if kind != "ws":
            env["EXECRELAY_SERVER_KEY"] = self.servers.server_key + ".pub"
            env["EXECRELAY_KEY"] = self.servers.client_key
        return env

    def proxy(self, env: Dict[str, str]) -> FaultProxy:
        """Put a fault proxy in front of `env`'s target (rewrites EXECRELAY_TARGET)."""
        url = env["EXECRELAY_TARGET"]
        scheme, rest = url.split("://", 1)
        hp, _, path = rest.partition("/")
        host, _, port = hp.rpartition(":")
        p = FaultProxy(host, int(port))
        self.proxies.append(p)
        env["EXECRELAY_TARGET"] = f"{scheme}://127.0.0.1:{p.port}" + (f"/{path}" if path else "")
        return p

    def adapter(self, env: Dict[str, str], **more: str) -> Adapter:
        full = {"CONFORMANCE_SCENARIO": self.name, "EXECRELAY_KEEPALIVE_MS": "",
                "EXECRELAY_PONG_TIMEOUT_MS": ""}
        full.update(env)
        full.update(more)
        log = os.path.join(self.kit.workdir, f"adapter-{self.name}-{len(self.adapters)}.log")
        a = Adapter(self.kit.adapter_cmd, full, log)
        self.adapters.append(a)
        return a

    def connected(self, env: Dict[str, str], **more: str) -> Adapter:
        """An adapter that connected (retrying while a relay environment registers)."""
        deadline = time.monotonic() + 30
        while True:
            a = self.adapter(env, **more)
            r = a.request("connect")
            if r.get("ok"):
                a.session = r.get("session")
                return a
            a.close()
            err = r.get("error") or {}
            if "offline" in json.dumps(err) and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise Failed(f"connect failed: {json.dumps(err)}")

    def server_output_form(self, session: Optional[str]) -> Optional[bool]:
        """Whether the server's log says it sends `session` binary output (None: not found)."""
        import re
        logs = "".join(p.log() for p in self.servers.procs)
        m = re.search(rf"initialized session={re.escape(session or '')} resumed=false binary=(true|false)", logs)
        return None if m is None else m.group(1) == "true"

    def check(self, cond: bool, what: str) -> None:
        """Record a check; raise Failed naming it when it does not hold."""
        self.checks.append(what)
        if not cond:
            raise Failed(what)

    def close(self) -> None:
        for a in self.adapters:
            a.close()
        for p in self.proxies:
            p.close()


class Kit:
    """Servers shared by the scenarios, keyed by their flags."""

    def __init__(self, adapter_cmd: List[str], workdir: str) -> None:
        self.adapter_cmd = adapter_cmd
        self.workdir = workdir
        self.servers = Servers(os.path.join(workdir, "servers"))
        self._urls: Dict[Any, str] = {}

    def server_url(self, kind: str, extra: tuple) -> str:
        key = (kind, extra)
        if key not in self._urls:
            if kind == "ws":
                url = self.servers.ws(*extra).url
            elif kind == "noise":
                url = self.servers.noise(*extra).url
            elif kind == "relay":
                url = self.servers.relay_pair(*extra)[2]
            else:
                raise ValueError(kind)
            self._urls[key] = url
        return self._urls[key]

    def close(self) -> None:
        self.servers.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Optional[str]) -> bytes:
    return base64.b64decode(text or "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", required=True, help="the adapter command (a shell-quoted string)")
    ap.add_argument("--name", default="", help="the client's name in the report")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--report", default="conformance-report.json")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args()

    from scenarios import SCENARIOS
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:32} {s.spec:28} {s.what}")
        return 0
    chosen = SCENARIOS
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {s.name for s in SCENARIOS}
        if unknown:
            print(f"unknown scenarios: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        chosen = [s for s in SCENARIOS if s.name in names]

    import tempfile
    workdir = tempfile.mkdtemp(prefix="execrelay-conformance-")
    try:
        kit = Kit(shlex.split(args.adapter), workdir)
    except ServerError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    results = []
    passed = failed = 0
    started = time.monotonic()
    try:
        for s in chosen:
            ctx = Context(kit, s.name)
            t0 = time.monotonic()
            error = None
            try:
                outcome: List[Any] = []
                th = threading.Thread(target=lambda: outcome.append(_run_one(s, ctx)), daemon=True)
                th.start()
                th.join(SCENARIO_TIMEOUT)
                if th.is_alive():
                    error = f"hang guard: not finished within {SCENARIO_TIMEOUT:g} s"
                else:
                    error = outcome[0] if outcome else "the scenario thread died"
            finally:
                ctx.close()
            secs = time.monotonic() - t0
            ok = error is None
            passed += ok
            failed += not ok
            mark = "PASS" if ok else "FAIL"
            print(f"{mark} {s.name} ({s.spec}, {secs:.1f} s)" + ("" if ok else f": {error}"),
                  flush=True)
            results.append({"name": s.name, "spec": s.spec, "what": s.what, "passed": ok,
                            "error": error, "seconds": round(secs, 3), "checks": ctx.checks,
                            "needs": s.needs})
    finally:
        kit.close()
    report = {"client": args.name or args.adapter, "adapter": args.adapter,
              "passed": passed, "failed": failed, "seconds": round(time.monotonic() - started, 1),
              "scenarios": results}
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    waiting = [r for r in results if not r["passed"] and r["needs"]]
    if waiting:
        print("failed scenarios that need a server feature: " +
              ", ".join(f"{r['name']} ({r['needs']})" for r in waiting))
    if failed == 0 and not os.environ.get("EXECRELAY_KEEP_SCRATCH"):
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"report: {os.path.abspath(args.report)}")
    else:
        print(f"report: {os.path.abspath(args.report)}; adapter logs and server logs: {workdir}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def _run_one(s: Any, ctx: Context) -> Optional[str]:
    try:
        s.fn(ctx)
        return None
    except Failed as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a bug in a scenario is a failure, with its trace
        return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


if __name__ == "__main__":
    sys.exit(main())
