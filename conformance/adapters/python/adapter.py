#!/usr/bin/env python3
"""Conformance adapter for the Python package `execrelay` (clients/python).

Reads the connection details from its environment and one JSON command per line on stdin,
answers one JSON line each on stdout (see conformance/README.md, "Adapter protocol").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import execrelay

PATTERN = bytes(range(251))
MAX_INLINE = 1 << 20


def env(name: str) -> Optional[str]:
    v = os.environ.get(name, "")
    return v or None


class Proc:
    def __init__(self) -> None:
        self.out = hashlib.sha256()
        self.err = hashlib.sha256()
        self.out_len = 0
        self.err_len = 0
        self.out_head = bytearray()
        self.err_head = bytearray()
        self.streams: List[str] = []
        self.omitted: List[List[Any]] = []
        self.seqs_ok = True
        self.last_seq = 0
        self.cond = threading.Condition()
        self.result: Optional[execrelay.Result] = None
        self.handle: Optional[execrelay.Process] = None

    def on_event(self, ev: execrelay.Event) -> None:
        with self.cond:
            if ev.seq != self.last_seq + 1:
                self.seqs_ok = False
            self.last_seq = ev.seq
            if ev.kind in ("stdout", "pty"):
                self.out.update(ev.data)
                self.out_len += len(ev.data)
                if len(self.out_head) < MAX_INLINE:
                    self.out_head += ev.data
            elif ev.kind == "stderr":
                self.err.update(ev.data)
                self.err_len += len(ev.data)
                if len(self.err_head) < MAX_INLINE:
                    self.err_head += ev.data
            elif ev.kind == "omitted":
                self.omitted.append([ev.stream, ev.omitted_bytes])
            if ev.kind in ("stdout", "stderr", "pty") and ev.kind not in self.streams:
                self.streams.append(ev.kind)
            if ev.kind == "exit":
                self.result = ev.result
            self.cond.notify_all()


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error_of(e: BaseException) -> Dict[str, Any]:
    if isinstance(e, execrelay.RefusedError):
        return {"type": "refused", "what": e.what, "message": str(e)}
    if isinstance(e, execrelay.StartError):
        return {"type": "start", "code": e.code, "what": e.what, "path": e.path,
                "errno": e.errno, "exit_code": e.exit_code, "message": str(e)}
    if isinstance(e, execrelay.NotApprovedError):
        return {"type": "not_approved", "reason": e.reason, "message": str(e)}
    if isinstance(e, execrelay.StdinClosed):
        return {"type": "stdin_closed", "message": str(e)}
    if isinstance(e, execrelay.RequestTooLarge):
        return {"type": "request_too_large", "size": e.size, "limit": e.limit,
                "message": str(e)}
    if isinstance(e, execrelay.SessionLost):
        return {"type": "session_lost", "message": str(e)}
    if isinstance(e, execrelay.RpcError):
        return {"type": "rpc", "code": e.code, "message": str(e)}
    if isinstance(e, execrelay.ConnectError):
        return {"type": "connect", "message": str(e)}
    return {"type": "other", "message": f"{type(e).__name__}: {e}"}


class Adapter:
    def __init__(self) -> None:
        self.client: Optional[execrelay.Client] = None
        self.procs: Dict[str, Proc] = {}
        self.approvals: List[Dict[str, Any]] = []

    def approve(self, req: execrelay.ApprovalRequest) -> bool:
        self.approvals.append({"id": req.id, "argv": req.argv, "rule": req.rule})
        emit({"event": "approval", "id": req.id, "argv": req.argv})
        delay = env("EXECRELAY_APPROVE_DELAY_MS")
        if delay:
            time.sleep(int(delay) / 1000)
        return env("EXECRELAY_APPROVE") == "yes"

    def op_connect(self, m: Dict[str, Any]) -> Dict[str, Any]:
        kw: Dict[str, Any] = {}
        if env("EXECRELAY_SERVER_KEY"):
            kw["server_key"] = env("EXECRELAY_SERVER_KEY")
        if env("EXECRELAY_KEY"):
            kw["key"] = env("EXECRELAY_KEY")
        if env("EXECRELAY_TOKEN"):
            kw["token"] = env("EXECRELAY_TOKEN")
        if env("EXECRELAY_KEEPALIVE_MS"):
            kw["keepalive_interval"] = int(env("EXECRELAY_KEEPALIVE_MS") or 0) / 1000
        if env("EXECRELAY_PONG_TIMEOUT_MS"):
            kw["pong_timeout"] = int(env("EXECRELAY_PONG_TIMEOUT_MS") or 0) / 1000
        if env("EXECRELAY_SESSION_TTL_MS"):
            kw["session_ttl"] = int(env("EXECRELAY_SESSION_TTL_MS") or 0) / 1000
        if env("EXECRELAY_NOISE_SUITE"):
            kw["noise_suite"] = int(env("EXECRELAY_NOISE_SUITE") or 0)
        if env("EXECRELAY_APPROVE"):
            kw["on_approval"] = self.approve
        kw["binary"] = env("EXECRELAY_BINARY") != "0"
        target = env("EXECRELAY_TARGET")
        assert target
        self.client = execrelay.connect(target, **kw)
        return {"session": self.client.session_id}

    def c(self) -> execrelay.Client:
        if self.client is None:
            raise RuntimeError("not connected")
        return self.client

    def op_capabilities(self, m: Dict[str, Any]) -> Dict[str, Any]:
        return {"capabilities": self.c().capabilities, "limits": self.c().limits}

    def op_start(self, m: Dict[str, Any]) -> Dict[str, Any]:
        p = Proc()
        cmd = m["shell"] if m.get("shell") is not None else m["argv"]
        kw: Dict[str, Any] = {"stdin": bool(m.get("stdin")), "tty": bool(m.get("tty")),
                              "on_event": p.on_event, "capture": False,
                              "process_id": m["id"]}
        if m.get("cwd") is not None:
            kw["cwd"] = m["cwd"]
        if m.get("env") is not None:
            kw["env"] = m["env"]
        if m.get("inherit_env") is False:
            kw["inherit_env"] = False
        if m.get("size"):
            kw["size"] = tuple(m["size"])
        if m.get("timeout_ms") is not None:
            kw["timeout"] = m["timeout_ms"] / 1000
        if m.get("output_cap") is not None:
            kw["output_cap"] = m["output_cap"]
            kw["keep_tail"] = bool(m.get("keep_tail"))
        self.procs[m["id"]] = p
        p.handle = self.c().start(cmd, **kw)
        return {"pid": p.handle.pid}

    def proc(self, m: Dict[str, Any]) -> Proc:
        return self.procs[m["id"]]

    def op_write(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        h.write(base64.b64decode(m["data_b64"]))
        return {}

    def op_write_pattern(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        n = int(m["bytes"])
        step = 251 * 4096
        block = PATTERN * 4096
        at = 0
        while at < n:
            k = min(step, n - at)
            h.write(block[:k])
            at += k
        return {}

    def op_close_stdin(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        h.close_stdin()
        return {}

    def op_resize(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        h.resize(m["rows"], m["cols"])
        return {}

    def op_signal(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        h.signal(m["signal"])
        return {}

    def op_terminate(self, m: Dict[str, Any]) -> Dict[str, Any]:
        h = self.proc(m).handle
        assert h is not None
        return {"running": h.terminate(m.get("grace_ms", 2000) / 1000)}

    def op_wait_output(self, m: Dict[str, Any]) -> Dict[str, Any]:
        p = self.proc(m)
        want = base64.b64decode(m["contains_b64"])
        deadline = time.monotonic() + m.get("timeout_ms", 30000) / 1000
        with p.cond:
            while want not in bytes(p.out_head):
                left = deadline - time.monotonic()
                if left <= 0 or p.result is not None:
                    raise TimeoutError(f"output never contained {want!r}")
                p.cond.wait(left)
        return {}

    def op_wait(self, m: Dict[str, Any]) -> Dict[str, Any]:
        p = self.proc(m)
        h = p.handle
        assert h is not None
        r = h.wait(m.get("timeout_ms", 60000) / 1000)
        with p.cond:
            out = {"exit_code": r.exit_code, "signal": r.signal, "reason": r.reason,
                   "reason_from_server": r.reason_from_server, "timed_out": r.timed_out,
                   "dropped_bytes": r.dropped_bytes, "stdout_len": p.out_len,
                   "stdout_sha256": p.out.hexdigest(), "stderr_len": p.err_len,
                   "stderr_sha256": p.err.hexdigest(), "omitted": p.omitted,
                   "streams": p.streams, "seqs_ok": p.seqs_ok, "resumes": self.c().resumes}
            if p.out_len <= MAX_INLINE:
                out["stdout_b64"] = base64.b64encode(bytes(p.out_head)).decode()
            if p.err_len <= MAX_INLINE:
                out["stderr_b64"] = base64.b64encode(bytes(p.err_head)).decode()
        return out

    def op_approvals(self, m: Dict[str, Any]) -> Dict[str, Any]:
        return {"approvals": self.approvals}

    def op_list(self, m: Dict[str, Any]) -> Dict[str, Any]:
        return {"processes": self.c().list()}

    def op_close(self, m: Dict[str, Any]) -> Dict[str, Any]:
        if self.client is not None:
            self.client.close()
            self.client = None
        return {}


def main() -> int:
    a = Adapter()
    for line in sys.stdin:
        if not line.strip():
            continue
        m = json.loads(line)
        op = m.get("op", "")
        fn = getattr(a, "op_" + op, None)
        if fn is None:
            emit({"ok": False, "error": {"type": "unsupported", "message": f"unknown op {op}"}})
            continue
        try:
            res = fn(m)
            res["ok"] = True
            emit(res)
        except Exception as e:  # noqa: BLE001 - reported to the runner
            emit({"ok": False, "error": error_of(e)})
        if op == "close":
            break
    if a.client is not None:
        a.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
