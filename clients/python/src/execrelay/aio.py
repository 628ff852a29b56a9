"""The asyncio API of execrelay: `connect`, `Client`, `Process`.

```python
from execrelay import aio
async with await aio.connect("ws://127.0.0.1:7000") as c:
    r = await c.run(["uname", "-a"])
```

Owns: the session (`initialize`, the resume token, resuming on its own inside the session's
TTL after a link dies), requests and their retries across a resume, the per-process event
streams (each event handed out once, in `seq` order: duplicates from a replay dropped, a gap
filled with `process/read`), acknowledgements of what was consumed, approvals, binary output
and binary writes where negotiated.

Must never: show a byte twice or skip one silently; hang when the server is gone (every wait
ends with the session or an error).
"""

from __future__ import annotations

import asyncio
import base64
from collections import deque
import errno as _errno
import inspect
import json
import re
import shlex
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from . import _link
from ._link import Link, LinkError, StreamReset
from ._noise import SUITE_AESGCM, SUITE_CHACHAPOLY, cpu_has_fast_aes
from ._target import Endpoint, check_window, resolve
from ._transport import NoiseTransport, TransportClosed, WsTransport
from ._write_retry import (WRITE_RETRY_FOR, WriteRetry, parse_cost, transient_limit,
                           write_cost)
from .errors import (ConnectError, ExecRelayError, NotApprovedError, OutputLost, ProtocolError,
                     RefusedError, RequestTooLarge, RpcError, SessionLost, StartError)
from .types import ApprovalRequest, Event, Result

__all__ = ["connect", "Client", "Process", "Result", "Event", "ApprovalRequest",
           "StdinClosed"]

#: Largest message accepted from the server (`protocol.md` §1 default).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Largest stdin chunk of one JSON `process/write`.
JSON_WRITE_CHUNK = 256 * 1024
#: Largest stdin chunk of one binary write: `MAX_CHUNK_BYTES` (64 KiB) less 512 bytes, so that
#: the write with its head and length prefix fits one Noise record (a stream's window counts
#: records), as the Rust library cuts them.
BINARY_WRITE_CHUNK = 64 * 1024 - 512
#: Binary writes one `write()` keeps in flight before it waits for the oldest answer: the
#: largest window a server grants (64 records, one write each), so that a far server's window
#: and not this pipeline sets an upload's speed.
BINARY_WRITES_IN_FLIGHT = 64
#: JSON writes one `write()` keeps in flight (2 MiB of 256 KiB chunks).
JSON_WRITES_IN_FLIGHT = 8
#: Acknowledge a process's events once this many output bytes were consumed since the last
#: ack (and always its exit notice), well inside the server's retention.
ACK_EVERY_BYTES = 512 * 1024
#: Reconnect backoff: first delay, doubling to the last.
RECONNECT_INITIAL_DELAY = 0.05
RECONNECT_MAX_DELAY = 2.0
#: A resume must finish this long before the session's TTL runs out to be worth trying.
TTL_MARGIN = 0.5
#: Default detached-session TTL when the server does not say (`DETACHED_SESSION_TTL`).
DEFAULT_TTL = 60.0
#: Largest `process/read` asked for while filling a gap.
READ_MAX_BYTES = 1 << 20
#: Decisions on approval requests remembered by id (a re-sent request is answered the same).
REMEMBERED_APPROVALS = 4096
#: How long `close()` waits for the server to end the session.
SESSION_CLOSE_TIMEOUT = 2.0
#: How often a `process/start` answered "already exists" (a retried start) looks for its pid.
START_LOOKUPS = 20

STREAMS = {0: "stdout", 1: "stderr", 2: "pty"}
_SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGUSR1": 10,
            "SIGUSR2": 12, "SIGTERM": 15, "SIGCONT": 18, "SIGSTOP": 19, "SIGWINCH": 28}

OnBytes = Callable[[bytes], Any]
OnApproval = Callable[[ApprovalRequest], Union[bool, Awaitable[bool]]]


class StdinClosed(ExecRelayError, BrokenPipeError):
    """A write to a process whose stdin is closed (or not piped), or that exited."""


class _Dropped(Exception):
    """The connection carrying a request ended before its answer: retry after a resume."""


def _forget(answers: "deque[asyncio.Future[Any]]") -> None:
    """Stop waiting for these answers: retrieve whatever they end with, so that asyncio does
    not report an exception nobody took."""
    while answers:
        answers.popleft().add_done_callback(lambda f: f.cancelled() or f.exception())


def _hello_suite(pinned: Optional[int]) -> int:
    if pinned is not None:
        if pinned not in (SUITE_CHACHAPOLY, SUITE_AESGCM):
            raise ValueError("noise_suite is 0 (ChaChaPoly) or 1 (AESGCM)")
        return pinned
    return SUITE_AESGCM if cpu_has_fast_aes() else SUITE_CHACHAPOLY


def _refused(reason: str, token: bool) -> RefusedError:
    if reason == "unauthorized":
        if token:
            return RefusedError("the server refused this client: its key is not in the server's "
                                "authorized keys, or the token was refused", "token", reason)
        return RefusedError("the server refused this client's key: add its .pub line to the "
                            "server's authorized keys", "key", reason)
    if reason == "handshake_failed":
        return RefusedError("the handshake failed: the pinned server key (server_key=) is not "
                            "this server's key", "server_key", reason)
    if reason == "clock_skew":
        return RefusedError("the server refused the handshake: this machine's clock is too far "
                            "from the server's (fix it with NTP)", "clock", reason)
    return RefusedError(f"the server refused the connection: {reason}", "other", reason)


#: The first words of the `404` an execrelay listener answers on a path it does not serve
#: (the exec server's `NOISE_SERVER_HINT`, the relay's `RELAY_HINT`).
_NOISE_SERVER_SAYS = b"this is an execrelay exec server speaking Noise"
_RELAY_SAYS = b"this is an execrelay relay"


def _connect_failure(display: str, url: str, e: BaseException) -> ConnectError:
    """A failed dial, saying what to do where we can tell: an execrelay listener reached on the
    wrong path answers `404` with a line naming what it is (the Rust CLI reads it the same way),
    and nothing listening is the commonest first mistake."""
    where = display if display == url else f"{display} ({url})"
    body = getattr(getattr(e, "response", None), "body", None)
    if body:
        # Recognised, never echoed: the words are ours, so a hostile listener cannot put its
        # own text (or terminal escapes) in front of the user.
        said = bytes(body[:256])
        host_port = url.split("://", 1)[-1].split("/", 1)[0]
        if said.startswith(_NOISE_SERVER_SAYS):
            return ConnectError(f"{display}: this is an execrelay exec server speaking Noise; "
                                f"use noise+ws://{host_port}")
        if said.startswith(_RELAY_SAYS):
            return ConnectError(f"{display}: this is an execrelay relay; clients use "
                                f"relay+ws://{host_port}/ENVIRONMENT_ID (relay+wss:// over TLS)")
    if isinstance(e, ConnectionRefusedError):
        return ConnectError(f"cannot connect to {where}: {e}: is the exec server (or relay) "
                            "running and listening on that address and port?")
    return ConnectError(f"cannot connect to {where}: {e}")


_FINAL_RESETS = {"unauthorized", "handshake_failed", "clock_skew"}
_RETRY_RESETS = {"busy", "replayed_handshake"}


def _message_limit(init_result: Mapping[str, Any]) -> Optional[int]:
    """``limits.maxMessageBytes`` of an initialize result, when it is a positive integer; any
    other value (missing, 0, negative, a boolean) says nothing a client can use: unknown, and
    nothing is refused locally (the Rust library does the same for 0, and refuses a
    non-number as a malformed initialize result)."""
    limits = init_result.get("limits")
    limit = limits.get("maxMessageBytes") if isinstance(limits, dict) else None
    return limit if type(limit) is int and limit > 0 else None


def _rpc_error(err: Mapping[str, Any], start_cwd: Optional[str] = None) -> RpcError:
    code = int(err.get("code", 0)) if isinstance(err.get("code"), int) else 0
    message = str(err.get("message", ""))
    data = err.get("data")
    if code == -32007:
        d = data if isinstance(data, dict) else {}
        return StartError(code, message, data, what=str(d.get("what", "other")),
                          path=d.get("path"), errno=d.get("errno"))
    if code == -32603 and message.startswith("spawn failed:"):
        # A server from before -32007: the message carries the OS error only.
        m = re.search(r"\(os error (\d+)\)", message)
        name = _errno.errorcode.get(int(m.group(1))) if m else None
        what = "program" if start_cwd is None and name in ("ENOENT", "EACCES", "ENOEXEC") else "other"
        return StartError(code, message, data, what=what, path=None, errno=name)
    if code == -32006:
        return NotApprovedError(code, message, data)
    if code == -32005:
        return OutputLost(code, message, data)
    return RpcError(code, message, data)


class _Connection:
    """One JSON-RPC connection: requests, responses, and what the server sends."""

    def __init__(self, client: "Client", transport: Any) -> None:
        self.client = client
        self.transport = transport
        self.pending: Dict[int, asyncio.Future] = {}
        self.closed = asyncio.get_running_loop().create_future()
        self.binary_input = False
        # The server's maxMessageBytes as this connection's own initialize said it (None until
        # then, or when it is not a positive integer: unknown, nothing refused here).
        self.max_message: Optional[int] = None
        self._send_lock = asyncio.Lock()
        self.reader: Optional[asyncio.Task] = None

    def start_reader(self) -> None:
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        why: Exception = TransportClosed("the connection closed")
        try:
            while True:
                msg = await self.transport.recv()
                if isinstance(msg, (bytes, bytearray)) and msg and msg[0] == 0:
                    self.client._on_binary(msg)
                    continue
                try:
                    obj = json.loads(msg)
                except ValueError:
                    raise ProtocolError("the server sent a message that is not JSON") from None
                if not isinstance(obj, dict):
                    raise ProtocolError("the server sent a JSON message that is not an object")
                self._dispatch(obj)
        except TransportClosed as e:
            why = e
        except ProtocolError as e:
            why = e
        except Exception as e:  # noqa: BLE001 - a bug must not leave requests hanging
            why = ProtocolError(f"cannot handle the server's message: {e!r}")
        self._close(why)

    def _close(self, why: Exception) -> None:
        if not self.closed.done():
            self.closed.set_result(why)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(_Dropped(str(why)))
        self.pending.clear()

    def _dispatch(self, obj: Dict[str, Any]) -> None:
        method = obj.get("method")
        if method is not None and "id" in obj:
            self.client._on_server_request(self, obj)
        elif method is not None:
            self.client._on_notification(method, obj.get("params") or {})
        elif "id" in obj:
            fut = self.pending.pop(obj["id"], None) if isinstance(obj["id"], int) else None
            if fut is not None and not fut.done():
                if "error" in obj and obj["error"] is not None:
                    fut.set_result(("error", obj["error"]))
                else:
                    fut.set_result(("ok", obj.get("result")))

    async def send(self, msg: Union[str, bytes]) -> None:
        async with self._send_lock:
            await self.transport.send(msg)

    async def request(self, method: str, params: Any, req_id: int) -> Tuple[str, Any]:
        return await (await self.start(method, params, req_id))

    async def start(self, method: str, params: Any, req_id: int) -> "asyncio.Future[Any]":
        """Send a request; its answer is the future returned (`_Dropped` if the connection
        ends first)."""
        text = json.dumps({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params},
                          separators=(",", ":"))
        # Never sent when larger than the server reads: it would close the connection on it,
        # and a request sent again on each new connection would loop.
        limit = self.max_message
        size = len(text.encode())
        if limit is not None and size > limit:
            raise RequestTooLarge(method, size, limit)
        return await self._start(text, req_id)

    async def _start(self, msg: Union[str, bytes], req_id: int) -> "asyncio.Future[Any]":
        if self.closed.done():
            raise _Dropped("the connection is closed")
        fut = asyncio.get_running_loop().create_future()
        self.pending[req_id] = fut
        try:
            await self.send(msg)
        except TransportClosed as e:
            self.pending.pop(req_id, None)
            self._close(e)
            raise _Dropped(str(e)) from None
        return fut

    async def start_binary(self, body: bytes, req_id: int) -> "asyncio.Future[Any]":
        """Send a binary request (`protocol.md` §5.2); its answer is the future returned.
        Checked against ``maxMessageBytes`` as a JSON request is (``RequestTooLarge``)."""
        if self.max_message is not None and len(body) > self.max_message:
            raise RequestTooLarge("process/write", len(body), self.max_message)
        return await self._start(body, req_id)

    async def notify(self, method: str, params: Any) -> None:
        text = json.dumps({"jsonrpc": "2.0", "method": method, "params": params},
                          separators=(",", ":"))
        try:
            await self.send(text)
        except TransportClosed as e:
            self._close(e)

    async def close(self) -> None:
        try:
            await self.transport.close()
        except Exception:  # noqa: BLE001
            pass
        self._close(TransportClosed("closed by the client"))
        if self.reader is not None:
            self.reader.cancel()


class _Proc:
    """Client-side state of one process: dedup by `seq`, acks, its queue and result."""

    def __init__(self, client: "Client", pid_name: str, argv: List[str], capture: bool,
                 queue_events: bool, on_stdout: Optional[OnBytes], on_stderr: Optional[OnBytes],
                 on_event: Optional[Callable[[Event], Any]]) -> None:
        self.client = client
        self.id = pid_name
        self.argv = argv
        self.pid = 0
        self.capture = capture
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.on_event = on_event
        self.last_seq = 0
        self.acked_seq = 0
        self.unacked_bytes = 0
        self.out: List[bytes] = []
        self.err: List[bytes] = []
        self.omitted: List[Tuple[str, int]] = []
        self.queue: Optional[asyncio.Queue] = asyncio.Queue() if queue_events else None
        self.early: Dict[int, Event] = {}
        self.filling = False
        self.result: asyncio.Future = asyncio.get_running_loop().create_future()
        self.signalled_by_client = False
        #: True once `process/start` was answered (acks wait for it).
        self.started = False
        self.failure: Optional[BaseException] = None

    def offer(self, ev: Event) -> None:
        if ev.seq <= self.last_seq or self.result.done():
            return  # a replayed event already handed out
        if ev.seq != self.last_seq + 1:
            self.early[ev.seq] = ev
            if not self.filling:
                self.filling = True
                asyncio.get_running_loop().create_task(self._fill_gap())
            return
        self._deliver(ev)
        while self.last_seq + 1 in self.early:
            self._deliver(self.early.pop(self.last_seq + 1))

    async def _fill_gap(self) -> None:
        try:
            while self.early and min(self.early) > self.last_seq + 1:
                res = await self.client._call("process/read", {
                    "processId": self.id, "afterSeq": self.last_seq, "maxBytes": READ_MAX_BYTES,
                    "waitMs": 0})
                evs = res.get("events") or []
                asked = self.last_seq
                for raw in evs:
                    ev = self.client._event_from_read(self, raw)
                    if ev is not None and ev.seq == self.last_seq + 1:
                        self._deliver(ev)
                while self.last_seq + 1 in self.early:
                    self._deliver(self.early.pop(self.last_seq + 1))
                if self.last_seq == asked:
                    # Nothing past what was asked (none, or only events at or before it):
                    # asked again, the server would answer the same, for ever. What it does
                    # not give is lost, as if it said so (-32005).
                    raise OutputLost(-32005, "the server gave nothing past seq "
                                     f"{asked} of {self.id}",
                                     {"fromSeq": asked + 1, "toSeq": min(self.early) - 1})
        except OutputLost as e:
            self.fail(e)
        except ExecRelayError as e:
            self.fail(e)
        finally:
            self.filling = False

    def _deliver(self, ev: Event) -> None:
        self.last_seq = ev.seq
        if ev.kind in ("stdout", "pty"):
            self.unacked_bytes += len(ev.data)
            if self.on_stdout is not None:
                self.client._callback(self.on_stdout, ev.data)
            elif self.capture:
                self.out.append(ev.data)
        elif ev.kind == "stderr":
            self.unacked_bytes += len(ev.data)
            if self.on_stderr is not None:
                self.client._callback(self.on_stderr, ev.data)
            elif self.capture:
                self.err.append(ev.data)
        elif ev.kind == "omitted":
            self.omitted.append((ev.stream, ev.omitted_bytes))
        if ev.kind == "exit" and ev.result is not None:
            ev.result.stdout = b"".join(self.out)
            ev.result.stderr = b"".join(self.err)
            ev.result.omitted = list(self.omitted)
            self.out, self.err = [], []
        if self.on_event is not None:
            self.client._callback(self.on_event, ev)
        if self.queue is not None:
            self.queue.put_nowait(ev)
        if ev.kind == "exit":
            self.client._ack(self, force=True)
            if not self.result.done():
                self.result.set_result(ev.result)
            self.client._forget(self)
        elif self.unacked_bytes >= ACK_EVERY_BYTES:
            self.client._ack(self)

    def fail(self, err: BaseException) -> None:
        if self.failure is None:
            self.failure = err
        if not self.result.done():
            self.result.set_exception(err)
            self.result.exception()  # retrieved: no "never retrieved" warning
        if self.queue is not None:
            self.queue.put_nowait(None)


class Process:
    """A started process (`Client.start`): its `id`, `pid`, stdin, signals and events."""

    def __init__(self, client: "Client", proc: _Proc) -> None:
        self._client = client
        self._proc = proc
        self._write_lock = asyncio.Lock()

    @property
    def id(self) -> str:
        """The process id chosen by this client (`processId`)."""
        return self._proc.id

    @property
    def pid(self) -> int:
        """The process's pid on the server."""
        return self._proc.pid

    @property
    def argv(self) -> List[str]:
        """The argv the server runs."""
        return list(self._proc.argv)

    async def write(self, data: bytes) -> None:
        """Write to the process's stdin (needs `stdin=True` or `tty=True`), in order.

        Raises `StdinClosed` when stdin is closed or the process exited. The data goes as
        chunks, several in flight (`BINARY_WRITES_IN_FLIGHT` or `JSON_WRITES_IN_FLIGHT`), and
        this returns once every chunk was accepted. Each chunk carries a `writeId`, so a write
        retried across a resume is applied once.
        """
        if isinstance(data, str):
            raise TypeError("write() takes bytes; encode text first")
        await self._write(bytes(data), close=False)

    async def _write(self, data: bytes, close: bool) -> None:
        c = self._client
        async with self._write_lock:
            binary = c._binary_input
            step = BINARY_WRITE_CHUNK if binary else c._json_write_chunk()
            depth = BINARY_WRITES_IN_FLIGHT if binary else JSON_WRITES_IN_FLIGHT
            view = memoryview(data)
            chunks = [bytes(view[i:i + step]) for i in range(0, len(data), step)] or [b""]
            writes = [(c._next_write_id(), chunk, close and i == len(chunks) - 1)
                      for i, chunk in enumerate(chunks)]
            status = await c._write_chunks(self.id, writes, depth)
            if status != "accepted":
                raise StdinClosed(f"process {self.id}: stdin not writable ({status})")
            if close and not c._binary_input:
                await c._call("process/closeStdin", {"processId": self.id})

    async def close_stdin(self) -> None:
        """Close the process's stdin: it reads end of file after every accepted write."""
        async with self._write_lock:
            await self._client._call("process/closeStdin", {"processId": self.id})

    async def resize(self, rows: int, cols: int) -> None:
        """Set a `tty=True` process's terminal size (it receives SIGWINCH)."""
        await self._client._call("process/resize", {"processId": self.id, "rows": rows,
                                                    "cols": cols})

    async def signal(self, name: Union[str, int]) -> None:
        """Send a signal (``"SIGINT"``, ``2``, ...) to the process's group."""
        if isinstance(name, int):
            names = {v: k for k, v in _SIGNALS.items()}
            if name not in names:
                raise ValueError(f"signal {name} is not one the protocol names")
            name = names[name]
        if not name.startswith("SIG"):
            name = "SIG" + name
        self._proc.signalled_by_client = True
        await self._client._call("process/signal", {"processId": self.id, "signal": name})

    async def terminate(self, grace: Optional[float] = None) -> bool:
        """SIGTERM to the group, SIGKILL after `grace` seconds; whether it was still running."""
        params: Dict[str, Any] = {"processId": self.id}
        if grace is not None:
            params["graceMs"] = int(grace * 1000)
        self._proc.signalled_by_client = True
        res = await self._client._call("process/terminate", params)
        return bool(res.get("running")) if isinstance(res, dict) else False

    async def wait(self, timeout: Optional[float] = None) -> Result:
        """The result when the process ends (the same type as `Client.run`'s).

        `timeout` (seconds) bounds the wait, not the process: `TimeoutError` when it passes,
        and the process runs on (`terminate()` it, or start it with `timeout=`)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._proc.result), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"process {self.id} still running after {timeout} s") from None

    def events(self) -> AsyncIterator[Event]:
        """Every event of the process in order (stdout, stderr, pty, omitted, exit), once."""
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        q = self._proc.queue
        if q is None:
            raise RuntimeError("this process was started without an event queue")
        while True:
            ev = await q.get()
            if ev is None:
                q.put_nowait(None)
                if self._proc.failure is not None:
                    raise self._proc.failure
                return
            yield ev
            if ev.kind == "exit":
                q.put_nowait(None)
                return


class Client:
    """A session on an exec server. Use `connect()`; `close()` (or `async with`) ends it."""

    def __init__(self, endpoint: Endpoint, *, binary: bool, on_approval: Optional[OnApproval],
                 session_ttl: Optional[float], noise_suite: Optional[int],
                 keepalive_interval: float, pong_timeout: float, reconnect: bool,
                 noise_window: Optional[int] = None,
                 client_name: str, callback_runner: Optional[Callable[..., Any]] = None,
                 write_retry_for: float = WRITE_RETRY_FOR) -> None:
        self._ep = endpoint
        self._binary = binary
        self._on_approval = on_approval
        self._session_ttl = session_ttl
        self._suite = _hello_suite(noise_suite) if endpoint.kind == "noise" else 0
        self._suite_pinned = noise_suite is not None
        self._window = noise_window if noise_window is not None else _link.DEFAULT_WINDOW
        self._keepalive = keepalive_interval
        self._pong_timeout = pong_timeout
        self._reconnect = reconnect
        self._client_name = client_name
        self._callback_runner = callback_runner
        self._loop = asyncio.get_running_loop()
        self._link: Optional[Link] = None
        self._conn: Optional[_Connection] = None
        self._connected = asyncio.Event()
        self._session: Optional[Tuple[str, str]] = None
        self._ttl = DEFAULT_TTL
        self._procs: Dict[str, _Proc] = {}
        self._next_id = 0
        self._next_proc = 0
        self._next_write = 0
        self._lost: Optional[BaseException] = None
        self._closing = False
        self._supervisor: Optional[asyncio.Task] = None
        self._approvals: Dict[str, asyncio.Future] = {}
        #: Acks owed while no connection was ready, by process (at most one per process).
        self._acks_later: Dict[str, int] = {}
        self._binary_input = False
        self._binary_output = False
        #: The server keeps a process's writes in order after refusing one (its last
        #: `initialize` said ``retryRefusedWrites``): a refused write may go again.
        self._retry_refused_writes = False
        self._write_retry_for = write_retry_for
        #: Writes the server refused for a limit and this client sent again, in all.
        self.writes_sent_again = 0
        #: What the last `initialize` result said.
        self.init_result: Dict[str, Any] = {}
        #: How many times the session was resumed on a new connection.
        self.resumes = 0
        #: The Noise suite of the current stream (None for `ws://`).
        self.noise_suite: Optional[int] = None
        #: The handshake payload of message 2 (`serverVersion`).
        self.server_hello: Dict[str, Any] = {}

    # Public --------------------------------------------------------------------------------

    @property
    def session_id(self) -> Optional[str]:
        """The server's session id."""
        return self._session[0] if self._session else None

    @property
    def capabilities(self) -> Dict[str, Any]:
        """What the server does for this connection (`initialize` result's capabilities)."""
        caps = self.init_result.get("capabilities")
        return dict(caps) if isinstance(caps, dict) else {}

    @property
    def limits(self) -> Dict[str, Any]:
        """The server's limits (`initialize` result's `limits`)."""
        lim = self.init_result.get("limits")
        return dict(lim) if isinstance(lim, dict) else {}

    async def start(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None,
                    env: Optional[Mapping[str, Optional[str]]] = None, inherit_env: bool = True,
                    stdin: bool = False, tty: bool = False,
                    size: Optional[Tuple[int, int]] = None, timeout: Optional[float] = None,
                    output_cap: Optional[int] = None, keep_tail: bool = False,
                    on_stdout: Optional[OnBytes] = None, on_stderr: Optional[OnBytes] = None,
                    on_event: Optional[Callable[[Event], Any]] = None, capture: bool = True,
                    process_id: Optional[str] = None, drain_timeout: Optional[float] = None,
                    kill_grace: Optional[float] = None,
                    kill_process_group_on_exit: bool = False) -> Process:
        """Start a process; a `str` runs through `/bin/sh -c`, a list is the exact argv.

        `size` is (rows, cols) for `tty=True`; `timeout` (seconds) terminates it and its
        result's reason is ``timeout``; `output_cap` caps delivered bytes per stream,
        `keep_tail=True` keeps the last half of the cap instead of dropping it. Output goes to
        `on_stdout`/`on_stderr` when given, else is captured into the result (`capture`), and
        every event is also available from `Process.events()`.
        """
        return await self._start(cmd, cwd=cwd, env=env, inherit_env=inherit_env, stdin=stdin,
                                 tty=tty, size=size, timeout=timeout, output_cap=output_cap,
                                 keep_tail=keep_tail, on_stdout=on_stdout, on_stderr=on_stderr,
                                 on_event=on_event, capture=capture, process_id=process_id,
                                 drain_timeout=drain_timeout, kill_grace=kill_grace,
                                 kill_process_group_on_exit=kill_process_group_on_exit,
                                 queue_events=True)

    async def run(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None,
                  env: Optional[Mapping[str, Optional[str]]] = None, inherit_env: bool = True,
                  input: Optional[bytes] = None, tty: bool = False,
                  size: Optional[Tuple[int, int]] = None, timeout: Optional[float] = None,
                  output_cap: Optional[int] = None, keep_tail: bool = False,
                  on_stdout: Optional[OnBytes] = None,
                  on_stderr: Optional[OnBytes] = None, check: bool = False) -> Result:
        """Run a command to its end and return its `Result` (stdout and stderr as bytes).

        `input` is written to stdin, then stdin is closed. `check=True` raises
        `CommandError` on a non-zero status.
        """
        p = await self._start(cmd, cwd=cwd, env=env, inherit_env=inherit_env,
                              stdin=input is not None, tty=tty, size=size, timeout=timeout,
                              output_cap=output_cap, keep_tail=keep_tail, on_stdout=on_stdout,
                              on_stderr=on_stderr, on_event=None, capture=True, process_id=None,
                              drain_timeout=None, kill_grace=None,
                              kill_process_group_on_exit=False, queue_events=False)
        if input is not None:
            try:
                await p._write(bytes(input), close=True)
            except StdinClosed:
                pass  # the command did not read all of it: its result says what it did
        res = await p.wait()
        return res.check() if check else res

    async def list(self) -> List[Dict[str, Any]]:
        """`process/list`: the processes of this session as the server sees them."""
        res = await self._call("process/list", {})
        return list(res.get("processes") or [])

    async def server_info(self) -> Dict[str, Any]:
        """`server/info`."""
        return dict(await self._call("server/info", {}))

    async def close(self, detach: bool = False) -> None:
        """End the session (`session/close`: the server terminates its processes) and close
        the connection. With `detach=True` the session is only detached: its processes keep
        running, their output retained, for the session's TTL."""
        if not detach and not self._closing and self._lost is None:
            conn = self._conn
            if conn is not None and not conn.closed.done():
                try:
                    await asyncio.wait_for(conn.request("session/close", {}, self._new_id()),
                                           SESSION_CLOSE_TIMEOUT)
                except (asyncio.TimeoutError, _Dropped):
                    pass  # the server detaches it and lets it expire
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self._conn is not None:
            await self._conn.close()
        if self._link is not None:
            await self._link.close()
        self._fail_all(SessionLost("the client was closed"))

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def drop_connection(self) -> None:
        """Abort the current transport as a network failure would (for tests and tools)."""
        if self._conn is not None:
            await self._conn.transport.abort()

    # Connection and session ----------------------------------------------------------------

    async def _open_transport(self) -> Any:
        ep = self._ep
        if ep.kind == "ws":
            try:
                return await WsTransport.connect(ep.url, max_message=MAX_MESSAGE_BYTES,
                                                 keepalive_interval=self._keepalive,
                                                 pong_timeout=self._pong_timeout)
            except Exception as e:  # noqa: BLE001
                raise _connect_failure(ep.display, ep.url, e) from None
        attempts = 0
        while True:
            if self._link is None or not self._link.alive:
                try:
                    self._link = await Link.connect(
                        ep.url, ep.environment, ca_file=ep.ca_file,
                        max_message=MAX_MESSAGE_BYTES, keepalive_interval=self._keepalive,
                        pong_timeout=self._pong_timeout)
                except Exception as e:  # noqa: BLE001
                    raise _connect_failure(ep.display, ep.url, e) from None
            assert ep.private_key is not None and ep.server_key is not None
            try:
                stream, hello = await self._link.open_stream(ep.private_key, ep.server_key,
                                                             self._suite, ep.token,
                                                             window=self._window,
                                                             fallback=not self._suite_pinned)
            except StreamReset as e:
                if e.reason in _FINAL_RESETS:
                    raise _refused(e.reason, ep.token is not None) from None
                if e.reason in _RETRY_RESETS and attempts < 3:
                    attempts += 1
                    await asyncio.sleep(0.05 * attempts)
                    continue
                if e.reason == "environment_offline":
                    raise ConnectError(f"{ep.display}: environment {ep.environment!r} is offline "
                                       "(its exec server has no link to the relay)") from None
                raise ConnectError(f"{ep.display}: stream refused ({e.reason})") from None
            except LinkError as e:
                raise ConnectError(f"{ep.display}: {e}") from None
            self.noise_suite = stream.suite
            self.server_hello = hello
            return NoiseTransport(self._link, stream)

    async def _establish(self, resume: bool) -> None:
        transport = await self._open_transport()
        conn = _Connection(self, transport)
        conn.start_reader()
        caps: Dict[str, Any] = {"acks": True, "binaryOutput": self._binary,
                                "binaryInput": self._binary}
        if self._on_approval is not None:
            caps["serverRequests"] = ["process/approve"]
        params: Dict[str, Any] = {"clientName": self._client_name, "clientVersion": _version(),
                                  "capabilities": caps}
        if self._session_ttl is not None:
            params["sessionTtlMs"] = int(self._session_ttl * 1000)
        if resume and self._session is not None:
            params["resume"] = {"sessionId": self._session[0], "resumeToken": self._session[1]}
        try:
            kind, res = await asyncio.wait_for(
                conn.request("initialize", params, self._new_id()), 30)
        except _Dropped as e:
            await conn.close()
            why = conn.closed.result() if conn.closed.done() else None
            reason = getattr(why, "reason", "")
            if reason in _FINAL_RESETS:
                raise _refused(reason, self._ep.token is not None) from None
            raise ConnectError(f"{self._ep.display}: the connection ended during initialize: {e}") from None
        except asyncio.TimeoutError:
            await conn.close()
            raise ConnectError(f"{self._ep.display}: no answer to initialize in 30 s") from None
        if kind == "error":
            await conn.close()
            err = _rpc_error(res)
            if resume and err.code == -32003:
                raise SessionLost("the server no longer knows this session (it expired, or the "
                                  "server restarted)")
            raise err
        if not isinstance(res, dict) or "sessionId" not in res:
            await conn.close()
            raise ProtocolError("the initialize result has no sessionId")
        self.init_result = res
        conn.max_message = _message_limit(res)
        self._session = (str(res["sessionId"]), str(res.get("resumeToken", "")))
        caps_res = res.get("capabilities") or {}
        self._binary_input = bool(caps_res.get("binaryInput")) and self._binary
        self._retry_refused_writes = bool(caps_res.get("retryRefusedWrites"))
        self._binary_output = bool(caps_res.get("binaryOutput"))
        ttl_ms = (res.get("limits") or {}).get("detachedSessionTtlMs")
        if isinstance(ttl_ms, int) and ttl_ms > 0:
            self._ttl = ttl_ms / 1000.0
        await conn.notify("initialized", {})
        self._conn = conn
        self._connected.set()
        later, self._acks_later = self._acks_later, {}
        for pid, seq in later.items():
            await conn.notify("process/ack", {"processId": pid, "seq": seq})
        if resume:
            self.resumes += 1
            # Processes whose start answer was lost are found again by _call's retry; every
            # other process gets its replay from the server after its last ack.

    async def _supervise(self) -> None:
        """Watch the connection; resume the session on a new one when it dies. Whatever
        happens here, waiters are woken: a bug becomes a SessionLost, never a hang."""
        try:
            await self._supervise_loop()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001
            import logging
            logging.getLogger("execrelay").exception("the session supervisor failed")
            self._fail_all(SessionLost(f"the client failed while resuming: {e!r}"))

    async def _supervise_loop(self) -> None:
        while not self._closing:
            conn = self._conn
            assert conn is not None
            why = await asyncio.shield(conn.closed)
            if self._closing:
                return
            self._connected.clear()
            self._conn = None
            if isinstance(why, ProtocolError) or not self._reconnect:
                self._fail_all(why if isinstance(why, ExecRelayError)
                               else SessionLost(f"the connection was lost: {why}"))
                return
            deadline = time.monotonic() + max(0.0, self._ttl - TTL_MARGIN)
            delay = RECONNECT_INITIAL_DELAY
            while True:
                try:
                    await self._establish(resume=True)
                    break
                except (SessionLost, RefusedError, ProtocolError) as e:
                    self._fail_all(e if isinstance(e, SessionLost)
                                   else SessionLost(f"cannot resume the session: {e}"))
                    return
                except (ConnectError, RpcError, OSError) as e:
                    if time.monotonic() + delay > deadline:
                        self._fail_all(SessionLost(
                            f"the connection was lost and could not be resumed within the "
                            f"session's TTL ({self._ttl:g} s): {e}"))
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_DELAY)

    def _fail_all(self, err: BaseException) -> None:
        if self._lost is None:
            self._lost = err
        self._connected.set()  # wake waiters: they see _lost
        for p in list(self._procs.values()):
            p.fail(err)
        self._procs.clear()
        if not self._closing:
            # Nothing more will use the link or the connection: release them.
            self._closing = True
            asyncio.ensure_future(self._release())

    async def _release(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._link is not None:
            await self._link.close()

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _json_write_chunk(self) -> int:
        """The stdin bytes of one JSON write: `JSON_WRITE_CHUNK`, or less where the server's
        ``maxMessageBytes`` would not take that much in base64 with its envelope (4 KiB)."""
        limit = _message_limit(self.init_result)
        if limit is None:
            return JSON_WRITE_CHUNK
        return max(1, min(JSON_WRITE_CHUNK, (limit - 4096) // 4 * 3))

    def _next_write_id(self) -> str:
        self._next_write += 1
        return f"w-{self._next_write}"

    async def _conn_ready(self) -> _Connection:
        while True:
            if self._lost is not None:
                raise self._lost
            if self._conn is not None and not self._conn.closed.done():
                return self._conn
            # No await between the check and the clear: the supervisor sets the event only
            # after it installed a new connection (or gave up, setting _lost).
            self._connected.clear()
            await self._connected.wait()

    async def _call(self, method: str, params: Any, *, cwd: Optional[str] = None) -> Any:
        """A request, retried on the resumed connection when its connection dies first."""
        while True:
            conn = await self._conn_ready()
            try:
                kind, res = await conn.request(method, params, self._new_id())
            except _Dropped:
                continue
            if kind == "error":
                raise _rpc_error(res if isinstance(res, dict) else {}, cwd)
            return res

    async def _write_chunks(self, pid: str, writes: Sequence[Tuple[str, bytes, bool]],
                            depth: int) -> str:
        """Send `writes` (writeId, chunk, close) in order with up to `depth` unanswered, so a
        far server is not held to one round trip per chunk. After a lost connection every
        unanswered one goes again, in order, with its `writeId`: the server applies each once.
        The first status that is not ``accepted``, or ``accepted``."""
        answers: "deque[asyncio.Future[Any]]" = deque()
        done = 0  # writes answered
        retry = WriteRetry(self._write_retry_for)
        # After a refusal the refused write goes again alone; those after it follow once it
        # is accepted (sent with it, they would only be refused again).
        solo = False
        try:
            while done < len(writes):
                conn = await self._conn_ready()
                try:
                    while (done + len(answers) < len(writes)
                           and len(answers) < (1 if solo else depth)):
                        wid, chunk, close = writes[done + len(answers)]
                        answers.append(await self._send_write(conn, pid, wid, chunk, close))
                    kind, res = await answers[0]
                except _Dropped:
                    _forget(answers)
                    continue
                if kind == "error":
                    err = _rpc_error(res if isinstance(res, dict) else {})
                    if err.code == -32001:
                        # Its exit was acknowledged and the server forgot it: it exited.
                        return "exited"
                    # Refused for a limit by a server that then refuses the writes behind it
                    # until it comes again: wait, then send it again alone.
                    pause = retry.after_refusal(
                        err.code, err.data, write_cost(len(writes[done][1]), self._binary_input),
                        self._retry_refused_writes, time.monotonic())
                    if pause is None:
                        raise err
                    _forget(answers)
                    solo = True
                    self.writes_sent_again += 1
                    await asyncio.sleep(pause)
                    continue
                answers.popleft()
                done += 1
                solo = False
                retry.accepted()
                status = str((res or {}).get("status", ""))
                if status != "accepted":
                    return status
            return "accepted"
        finally:
            _forget(answers)

    async def _send_write(self, conn: "_Connection", pid: str, wid: str, chunk: bytes,
                          close: bool) -> "asyncio.Future[Any]":
        req_id = self._new_id()
        if self._binary_input:
            p, w = pid.encode(), wid.encode()
            body = (b"\x01" + bytes([1 if close else 0]) + req_id.to_bytes(8, "big")
                    + len(p).to_bytes(2, "big") + bytes([len(w)]) + p + w + chunk)
            return await conn.start_binary(body, req_id)
        return await conn.start("process/write", {
            "processId": pid, "chunk": base64.b64encode(chunk).decode("ascii"),
            "writeId": wid}, req_id)

    async def _start(self, cmd: Union[str, Sequence[str]], *, queue_events: bool,
                     cwd: Optional[str], env: Optional[Mapping[str, Optional[str]]],
                     inherit_env: bool, stdin: bool, tty: bool, size: Optional[Tuple[int, int]],
                     timeout: Optional[float], output_cap: Optional[int], keep_tail: bool,
                     on_stdout: Optional[OnBytes], on_stderr: Optional[OnBytes],
                     on_event: Optional[Callable[[Event], Any]], capture: bool,
                     process_id: Optional[str], drain_timeout: Optional[float],
                     kill_grace: Optional[float], kill_process_group_on_exit: bool) -> Process:
        if isinstance(cmd, str):
            argv = ["/bin/sh", "-c", cmd]
        else:
            argv = [str(a) for a in cmd]
            if not argv:
                raise ValueError("an argv needs at least the program")
        if process_id is None:
            self._next_proc += 1
            process_id = f"p-{self._next_proc}"
        params: Dict[str, Any] = {"processId": process_id, "argv": argv,
                                  "inheritEnv": inherit_env, "tty": tty, "pipeStdin": stdin}
        if cwd is not None:
            params["cwd"] = cwd
        if env:
            params["env"] = dict(env)
        if size is not None:
            params["size"] = {"rows": int(size[0]), "cols": int(size[1])}
        if timeout is not None:
            params["timeoutMs"] = int(timeout * 1000)
        if output_cap is not None:
            params["outputBytesCap"] = int(output_cap)
            if keep_tail:
                params["outputCapKeep"] = "headAndTail"
        if drain_timeout is not None:
            params["drainTimeoutMs"] = int(drain_timeout * 1000)
        if kill_grace is not None:
            params["killGraceMs"] = int(kill_grace * 1000)
        if kill_process_group_on_exit:
            params["killProcessGroupOnExit"] = True
        if self._lost is not None:
            raise self._lost
        if process_id in self._procs:
            raise ValueError(f"process id {process_id!r} is in use")
        proc = _Proc(self, process_id, argv, capture, queue_events, on_stdout, on_stderr,
                     on_event)
        self._procs[process_id] = proc
        try:
            res = await self._start_call(params, cwd)
        except BaseException:
            self._procs.pop(process_id, None)
            raise
        proc.pid = int(res.get("pid", 0)) if isinstance(res, dict) else 0
        proc.started = True
        if proc.last_seq > proc.acked_seq:
            self._ack(proc, force=proc.result.done())
        return Process(self, proc)

    async def _start_call(self, params: Dict[str, Any], cwd: Optional[str]) -> Any:
        attempts = 0
        resumes = self.resumes
        refusals = WriteRetry(self._write_retry_for)
        # The least the server charges it, as it charges (text and parsed values): a start of
        # many short arguments costs far more than its text, and one that can never fit the
        # byte budget is given up at once. Priced at its first refusal only, as the Rust
        # client does: a start that goes through is never encoded twice.
        cost: Optional[int] = None
        while True:
            try:
                return await self._call("process/start", params, cwd=cwd)
            except RpcError as e:
                # Refused for a limit that empties as other requests are answered (uploads
                # held by children that do not read): this attempt started nothing. Tried
                # again with the pauses and bound of a refused write.
                if transient_limit(e.code, e.data):
                    if cost is None:
                        cost = parse_cost(json.dumps(params, separators=(",", ":")).encode())
                    # An attempt on a connection since lost may have started it, and it may
                    # have exited and been forgotten during the pauses: sent again, it would
                    # run twice. Asked after each pause, and once more before the refusal is
                    # raised; while the lookup itself is refused, nothing is sent.
                    while True:
                        pause = refusals.after_refusal(e.code, e.data, cost, True,
                                                       time.monotonic())
                        if pause is not None:
                            await asyncio.sleep(pause)
                        earlier, known = (None, True)
                        if self.resumes != resumes:
                            earlier, known = await self._started_earlier(params["processId"])
                        if earlier is not None:
                            return earlier
                        if pause is None:
                            raise
                        if known:
                            break
                    continue
                # After a lost attempt, a limit may be that attempt's own doing (its process
                # counted against maxProcesses): looked up before it is raised.
                if e.code == -32004 and self.resumes != resumes:
                    earlier, _ = await self._started_earlier(params["processId"])
                    if earlier is not None:
                        return earlier
                    raise
                # A start retried after a resume may have been applied already: find it.
                if e.code != -32002 or self.resumes == resumes or attempts >= START_LOOKUPS:
                    raise
                attempts += 1
                for entry in await self.list():
                    if entry.get("processId") == params["processId"] and entry.get("pid"):
                        return {"processId": params["processId"], "pid": entry["pid"]}
                await asyncio.sleep(RECONNECT_INITIAL_DELAY)

    async def _started_earlier(
            self, process_id: str) -> Tuple[Optional[Dict[str, Any]], bool]:
        """What an earlier attempt of this start, on a connection since lost, did: (its
        result, True) if it started (events of it arrived, or the server lists it with a
        pid); (None, True) if it did not, or not yet (it goes again); (None, False) if nothing
        says either way (the lookup failed and nothing was heard)."""
        proc = self._procs.get(process_id)
        heard = proc is not None and proc.last_seq > 0
        try:
            listed = [e for e in await self.list() if e.get("processId") == process_id]
        except ExecRelayError:
            listed = None
        pid = listed[0].get("pid") if listed else None
        if pid:
            return {"processId": process_id, "pid": pid}, True
        if heard:
            return {"processId": process_id, "pid": 0}, True
        return None, listed is not None

    # What the server sends -----------------------------------------------------------------

    def _callback(self, fn: Callable[..., Any], arg: Any) -> None:
        if self._callback_runner is not None:
            self._callback_runner(fn, arg)
            return
        try:
            r = fn(arg)
            if inspect.isawaitable(r):
                asyncio.ensure_future(r)
        except Exception:  # noqa: BLE001 - an application callback must not kill the reader
            import logging
            logging.getLogger("execrelay").exception("callback %r failed", fn)

    def _on_binary(self, msg: "bytes | bytearray") -> None:
        if len(msg) < 13:
            raise ProtocolError(f"binary output message of {len(msg)} bytes is too short")
        stream = STREAMS.get(msg[1])
        if stream is None:
            raise ProtocolError(f"binary output message with unknown stream {msg[1]}")
        seq = int.from_bytes(msg[2:10], "big")
        n = int.from_bytes(msg[10:12], "big")
        if n < 1 or n > 256 or len(msg) < 12 + n + 1:
            raise ProtocolError("binary output message lengths do not add up")
        try:
            pid = bytes(msg[12:12 + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("binary output message: process id is not UTF-8") from None
        chunk = bytes(msg[12 + n:])
        if len(chunk) > 64 * 1024:
            raise ProtocolError("binary output message: chunk over 64 KiB")
        p = self._procs.get(pid)
        if p is not None:
            p.offer(Event(stream, seq, data=chunk, stream=stream))

    def _on_notification(self, method: str, params: Dict[str, Any]) -> None:
        if not isinstance(params, dict):
            return
        p = self._procs.get(str(params.get("processId", "")))
        if p is None:
            if method == "process/exited" and isinstance(params.get("seq"), int):
                # The exit of a process already finished here, replayed because its ack was
                # lost with a connection: acknowledge it again so the server can forget it.
                conn = self._conn
                if conn is not None:
                    asyncio.ensure_future(conn.notify("process/ack", {
                        "processId": params.get("processId"), "seq": params["seq"]}))
            return
        seq = params.get("seq")
        if not isinstance(seq, int):
            raise ProtocolError(f"{method} without an integer seq")
        if method == "process/outputDelta":
            stream = str(params.get("stream", "stdout"))
            try:
                chunk = base64.b64decode(params.get("chunk", ""), validate=True)
            except ValueError:
                raise ProtocolError("process/outputDelta: chunk is not base64") from None
            p.offer(Event(stream, seq, data=chunk, stream=stream))
        elif method == "process/outputOmitted":
            p.offer(Event("omitted", seq, stream=str(params.get("stream", "")),
                          omitted_bytes=int(params.get("omittedBytes", 0))))
        elif method == "process/exited":
            p.offer(Event("exit", seq, result=self._result(p, params)))

    def _result(self, p: _Proc, n: Mapping[str, Any]) -> Result:
        reason = n.get("reason")
        from_server = isinstance(reason, str)
        if not from_server:
            # A server from before `reason`: infer what can be known here.
            if n.get("timedOut"):
                reason = "timeout"
            elif p.signalled_by_client:
                reason = "terminated"
            else:
                reason = "exited"
        return Result(argv=list(p.argv), exit_code=n.get("exitCode"), signal=n.get("signal"),
                      reason=str(reason), duration=float(n.get("durationMs") or 0) / 1000.0,
                      timed_out=bool(n.get("timedOut")),
                      output_drain_timed_out=bool(n.get("outputDrainTimedOut")),
                      stdout_bytes=int(n.get("stdoutBytes") or 0),
                      stderr_bytes=int(n.get("stderrBytes") or 0),
                      dropped_bytes=int(n.get("droppedBytes") or 0),
                      reason_from_server=from_server)

    def _event_from_read(self, p: _Proc, raw: Mapping[str, Any]) -> Optional[Event]:
        seq = raw.get("seq")
        if not isinstance(seq, int):
            return None
        t = raw.get("type")
        if t == "output":
            stream = str(raw.get("stream", "stdout"))
            return Event(stream, seq, data=base64.b64decode(raw.get("chunk", "")), stream=stream)
        if t == "exited":
            return Event("exit", seq, result=self._result(p, raw))
        if t in ("outputOmitted", "omitted"):
            return Event("omitted", seq, stream=str(raw.get("stream", "")),
                         omitted_bytes=int(raw.get("omittedBytes", 0)))
        return None

    def _ack(self, p: _Proc, force: bool = False) -> None:
        if not p.started:
            # Until its start is answered the server must keep the process: a start retried
            # after a resume finds it (-32002, then process/list) instead of running it twice.
            return
        if p.last_seq <= p.acked_seq or (not force and p.unacked_bytes < ACK_EVERY_BYTES):
            return
        p.acked_seq = p.last_seq
        p.unacked_bytes = 0
        conn = self._conn
        if conn is None or conn.closed.done():
            # Between connections (a replay arrives before `initialized` went out): sent as
            # soon as the resumed connection is ready.
            self._acks_later[p.id] = p.last_seq
            return
        asyncio.ensure_future(conn.notify("process/ack", {"processId": p.id,
                                                          "seq": p.last_seq}))

    def _forget(self, p: _Proc) -> None:
        if self._procs.get(p.id) is p:
            del self._procs[p.id]

    def _on_server_request(self, conn: _Connection, obj: Dict[str, Any]) -> None:
        asyncio.ensure_future(self._answer(conn, obj))

    async def _answer(self, conn: _Connection, obj: Dict[str, Any]) -> None:
        rid = obj.get("id")
        method = obj.get("method")
        if method != "process/approve" or self._on_approval is None:
            text = json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32601, "message": f"method not found: {method}"}})
            await conn.send(text)
            return
        key = str(rid)
        decision = self._approvals.get(key)
        if decision is None:
            # Taken once per id: a request re-sent after a resume, while the application is
            # still deciding, waits for the same decision instead of asking again.
            decision = asyncio.get_running_loop().create_future()
            self._approvals[key] = decision
            if len(self._approvals) > REMEMBERED_APPROVALS:
                self._approvals.pop(next(iter(self._approvals)))
            pr = obj.get("params") or {}
            req = ApprovalRequest(id=key, process_id=str(pr.get("processId", "")),
                                  argv=list(pr.get("argv") or []), cwd=pr.get("cwd"),
                                  env_names=list(pr.get("envNames") or []),
                                  tty=bool(pr.get("tty")), rule=pr.get("rule"))
            try:
                r = self._on_approval(req)
                if inspect.isawaitable(r):
                    r = await r
                decision.set_result(bool(r))
            except Exception:  # noqa: BLE001 - a failing handler denies
                decision.set_result(False)
        ok = await asyncio.shield(decision)
        # Answer on whichever connection is current (the request is re-sent after a resume).
        target = self._conn or conn
        try:
            await target.send(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "decision": "approve" if ok else "deny"}}))
        except TransportClosed:
            pass


def _version() -> str:
    from . import __version__

    return __version__


async def connect(target: str, *, server_key: "str | bytes | None" = None,
                  key: "str | bytes | None" = None, token: Optional[str] = None,
                  ca_file: Optional[str] = None, binary: bool = True,
                  on_approval: Optional[OnApproval] = None,
                  session_ttl: Optional[float] = None, noise_suite: Optional[int] = None,
                  noise_window: Optional[int] = None,
                  keepalive_interval: float = _link.KEEPALIVE_INTERVAL,
                  pong_timeout: float = _link.PONG_TIMEOUT, reconnect: bool = True,
                  client_name: str = "execrelay-python",
                  write_retry_for: float = WRITE_RETRY_FOR,
                  _callback_runner: Optional[Callable[..., Any]] = None) -> Client:
    """Connect to an exec server and open a session.

    `target`: ``ws://HOST:PORT``, ``noise+ws://HOST:PORT``, ``relay+ws://RELAY:PORT/ENV``,
    ``relay+wss://RELAY:PORT/ENV`` or a host alias of the CLI's configuration file (its
    `url`, `server_key`, `key`, `ca_file`, `token_file`; arguments given here win). Noise
    targets need `server_key` (a `.pub` file or the key line) and `key` (the private key
    file; default ``~/.config/execrelay/id``). `binary` asks for binary output and binary
    writes where the server offers them. `on_approval(request) -> bool` answers the exec
    policy's questions (none given: every such start is denied). `session_ttl` (seconds)
    asks the server to keep a detached session that long. `noise_suite` pins 0 (ChaChaPoly) or
    1 (AESGCM); by default AESGCM where the CPU has AES instructions, falling back to 0 when the
    server refuses it. `noise_window` is the receive window of each stream in records of at
    most 64 KiB (1 to 256, default 32): a stream moves at most one window per round trip, so
    a server far away wants more (64 is the most a relay passes on by default), at that much
    memory per stream. A host alias's `noise_suite` and `noise_window` apply when these are
    not given. `write_retry_for` (seconds, default 60): how long a write the server refuses for
    a full limit is sent again, with the writes after it, on a server that keeps a process's
    writes in order after a refusal (``capabilities.retryRefusedWrites``); 0 raises the first
    refusal (`RpcError`, code -32004).
    """
    ep = resolve(target, server_key=server_key, key=key, token=token, ca_file=ca_file)
    if noise_suite is None:
        noise_suite = ep.noise_suite
    if noise_window is None:
        noise_window = ep.noise_window
    if noise_window is not None:
        check_window(noise_window)
    c = Client(ep, binary=binary, on_approval=on_approval, session_ttl=session_ttl,
               noise_suite=noise_suite, noise_window=noise_window,
               keepalive_interval=keepalive_interval,
               pong_timeout=pong_timeout, reconnect=reconnect, client_name=client_name,
               callback_runner=_callback_runner, write_retry_for=write_retry_for)
    try:
        await c._establish(resume=False)
    except BaseException:
        if c._link is not None:
            await c._link.close()
        raise
    c._supervisor = asyncio.get_running_loop().create_task(c._supervise())
    return c


def join_command(words: Sequence[str]) -> str:
    """Quote words for `/bin/sh -c` (the inverse of what `run(str)` does)."""
    return " ".join(shlex.quote(w) for w in words)
