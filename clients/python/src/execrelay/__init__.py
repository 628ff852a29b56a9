"""execrelay: run commands on remote sandbox hosts, over plain or Noise-encrypted WebSockets,
directly or through a relay, with output that survives a broken link.

The blocking API (this module) and the asyncio API (`execrelay.aio`) have the same names:

```python
import execrelay

with execrelay.connect("ws://127.0.0.1:7000") as c:
    r = c.run("echo hi; echo oops >&2; exit 3")
    print(r.exit_code, r.stdout, r.stderr)      # 3 b'hi\\n' b'oops\\n'
```

The blocking client runs the asyncio client on one background event-loop thread per Python
process; callbacks (`on_stdout`, `on_stderr`, `on_event`, `on_approval`) run on a thread of
their own per client, in order, so a slow callback never stalls the connection.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import aio
from ._link import KEEPALIVE_INTERVAL, PONG_TIMEOUT
from ._write_retry import WRITE_RETRY_FOR
from .aio import StdinClosed
from .errors import (CommandError, ConfigError, ConnectError, ExecRelayError, NotApprovedError,
                     OutputLost, ProtocolError, RefusedError, RequestTooLarge, RpcError,
                     SessionLost, StartError)
from .types import ApprovalRequest, Event, Result

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Process", "Result", "Event", "ApprovalRequest", "aio",
    "ExecRelayError", "ConfigError", "ConnectError", "RefusedError", "ProtocolError",
    "SessionLost", "RpcError", "StartError", "NotApprovedError", "OutputLost", "CommandError",
    "RequestTooLarge",
    "StdinClosed", "__version__",
]

_loop_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_thread: Optional[threading.Thread] = None


def _background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop the blocking API runs on (a daemon thread)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="execrelay-loop", daemon=True)
            t.start()
            global _loop_thread
            _loop_thread = t
            _loop = loop
        return _loop


def _run(coro: Any, timeout: Optional[float] = None) -> Any:
    loop = _background_loop()
    if threading.current_thread() is _loop_thread:
        raise RuntimeError("blocking execrelay call from the client's own loop thread")
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except BaseException:
        fut.cancel()
        raise


class _Callbacks:
    """One thread per client that runs the application's callbacks in order."""

    def __init__(self) -> None:
        # A deque and an event rather than a queue: the loop thread appends without a lock,
        # and the worker wakes once per batch instead of once per chunk (fewer hand-offs of
        # the GIL on the output path).
        self._items: "collections.deque[Optional[Tuple[Callable[..., Any], Any]]]" = collections.deque()
        self._wake = threading.Event()
        self._t = threading.Thread(target=self._work, name="execrelay-callbacks", daemon=True)
        self._t.start()

    def submit(self, fn: Callable[..., Any], arg: Any) -> None:
        self._items.append((fn, arg))
        if not self._wake.is_set():
            self._wake.set()

    def _work(self) -> None:
        import logging

        items, wake = self._items, self._wake
        while True:
            wake.wait()
            wake.clear()
            while items:
                item = items.popleft()
                if item is None:
                    return
                fn, arg = item
                try:
                    fn(arg)
                except Exception:  # noqa: BLE001 - a callback's bug must not end the others
                    logging.getLogger("execrelay").exception("callback %r failed", fn)

    def call_sync(self, fn: Callable[..., Any], arg: Any) -> "asyncio.Future[Any]":
        """Run `fn(arg)` on the callback thread; a future of the loop for its result."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[Any]" = loop.create_future()

        def settle(result: Any, error: Optional[BaseException]) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def job(a: Any) -> None:
            try:
                r = fn(a)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                loop.call_soon_threadsafe(settle, None, e)
                return
            loop.call_soon_threadsafe(settle, r, None)

        self.submit(job, arg)
        return fut

    def barrier(self, timeout: Optional[float] = None) -> None:
        """Wait until every callback queued so far has run."""
        if threading.current_thread() is self._t or not self._t.is_alive():
            return
        done = threading.Event()
        self.submit(lambda _: done.set(), None)
        done.wait(timeout)

    def stop(self) -> None:
        self._items.append(None)
        self._wake.set()


class Process:
    """A started process (blocking API): `id`, `pid`, `write()`, `close_stdin()`, `resize()`,
    `signal()`, `terminate()`, `wait()`, `events()`."""

    def __init__(self, inner: aio.Process, callbacks: "_Callbacks") -> None:
        self._p = inner
        self._cb = callbacks

    @property
    def id(self) -> str:
        """The process id this client chose (`processId`)."""
        return self._p.id

    @property
    def pid(self) -> int:
        """The pid on the server."""
        return self._p.pid

    @property
    def argv(self) -> List[str]:
        """The argv the server runs."""
        return self._p.argv

    def write(self, data: bytes) -> None:
        """Write to stdin, in order; `StdinClosed` when stdin is closed or the process exited."""
        _run(self._p.write(data))

    def close_stdin(self) -> None:
        """Close stdin: the process reads end of file after every accepted write."""
        _run(self._p.close_stdin())

    def resize(self, rows: int, cols: int) -> None:
        """Set a `tty=True` process's terminal size."""
        _run(self._p.resize(rows, cols))

    def signal(self, name: Union[str, int]) -> None:
        """Send a signal by name (``"SIGINT"``) or number to the process's group."""
        _run(self._p.signal(name))

    def terminate(self, grace: Optional[float] = None) -> bool:
        """SIGTERM, then SIGKILL after `grace` seconds; whether it was still running."""
        return bool(_run(self._p.terminate(grace)))

    def wait(self, timeout: Optional[float] = None) -> Result:
        """Block until the process ends; its `Result` (as `Client.run` returns).

        When it returns, every `on_stdout`/`on_stderr`/`on_event` callback of the process's
        output has run."""
        res = _run(self._p.wait(timeout))
        self._cb.barrier()
        return res

    def events(self) -> Iterator[Event]:
        """Every event (stdout, stderr, pty, omitted, exit) in order, each once."""
        agen = self._p.events()

        async def nxt() -> Tuple[bool, Optional[Event]]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        while True:
            ok, ev = _run(nxt())
            if not ok:
                return
            assert ev is not None
            yield ev


class Client:
    """A session on an exec server (blocking API). Made by `connect()`; a context manager."""

    def __init__(self, inner: aio.Client, callbacks: _Callbacks) -> None:
        self._c = inner
        self._cb = callbacks

    @property
    def aio(self) -> aio.Client:
        """The asyncio client underneath (runs on the background loop thread)."""
        return self._c

    @property
    def session_id(self) -> Optional[str]:
        """The server's session id."""
        return self._c.session_id

    @property
    def capabilities(self) -> Dict[str, Any]:
        """What the server does for this connection (binary output, acks, ...)."""
        return self._c.capabilities

    @property
    def limits(self) -> Dict[str, Any]:
        """The server's limits from `initialize`."""
        return self._c.limits

    @property
    def resumes(self) -> int:
        """How many times the session was resumed after a lost connection."""
        return self._c.resumes

    @property
    def writes_sent_again(self) -> int:
        """Writes the server refused for a full limit and this client sent again (see
        `write_retry_for`)."""
        return self._c.writes_sent_again

    @property
    def noise_suite(self) -> Optional[int]:
        """The Noise suite of the current stream (0 ChaChaPoly, 1 AESGCM; None on ws://)."""
        return self._c.noise_suite

    def run(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None,
            env: Optional[Mapping[str, Optional[str]]] = None, inherit_env: bool = True,
            input: Optional[bytes] = None, tty: bool = False,
            size: Optional[Tuple[int, int]] = None, timeout: Optional[float] = None,
            output_cap: Optional[int] = None, keep_tail: bool = False,
            on_stdout: Optional[Callable[[bytes], Any]] = None,
            on_stderr: Optional[Callable[[bytes], Any]] = None, check: bool = False) -> Result:
        """Run a command to its end: a `str` through `/bin/sh -c`, a list as the exact argv.

        Returns `Result` (`exit_code`, `signal`, `reason`, `stdout`, `stderr`, `duration`);
        `check=True` raises `CommandError` on a non-zero status.
        """
        try:
            return _run(self._c.run(cmd, cwd=cwd, env=env, inherit_env=inherit_env, input=input,
                                    tty=tty, size=size, timeout=timeout, output_cap=output_cap,
                                    keep_tail=keep_tail, on_stdout=on_stdout,
                                    on_stderr=on_stderr, check=check))
        finally:
            if on_stdout is not None or on_stderr is not None:
                self._cb.barrier()

    def start(self, cmd: Union[str, Sequence[str]], *, cwd: Optional[str] = None,
              env: Optional[Mapping[str, Optional[str]]] = None, inherit_env: bool = True,
              stdin: bool = False, tty: bool = False, size: Optional[Tuple[int, int]] = None,
              timeout: Optional[float] = None, output_cap: Optional[int] = None,
              keep_tail: bool = False, on_stdout: Optional[Callable[[bytes], Any]] = None,
              on_stderr: Optional[Callable[[bytes], Any]] = None,
              on_event: Optional[Callable[[Event], Any]] = None, capture: bool = True,
              process_id: Optional[str] = None) -> Process:
        """Start a process and return its handle at once (see `aio.Client.start`)."""
        return Process(_run(self._c.start(
            cmd, cwd=cwd, env=env, inherit_env=inherit_env, stdin=stdin, tty=tty, size=size,
            timeout=timeout, output_cap=output_cap, keep_tail=keep_tail, on_stdout=on_stdout,
            on_stderr=on_stderr, on_event=on_event, capture=capture, process_id=process_id)),
            self._cb)

    def list(self) -> List[Dict[str, Any]]:
        """`process/list`."""
        return _run(self._c.list())

    def server_info(self) -> Dict[str, Any]:
        """`server/info`."""
        return _run(self._c.server_info())

    def drop_connection(self) -> None:
        """Abort the current transport as a network failure would (tests and tools)."""
        _run(self._c.drop_connection())

    def close(self, detach: bool = False) -> None:
        """End the session and close the connection; `detach=True` leaves the session and its
        processes to the server for the session's TTL (see `aio.Client.close`)."""
        try:
            _run(self._c.close(detach))
        finally:
            self._cb.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(target: str, *, server_key: "str | bytes | None" = None,
            key: "str | bytes | None" = None, token: Optional[str] = None,
            ca_file: Optional[str] = None, binary: bool = True,
            on_approval: Optional[Callable[[ApprovalRequest], bool]] = None,
            session_ttl: Optional[float] = None, noise_suite: Optional[int] = None,
            noise_window: Optional[int] = None,
            keepalive_interval: float = KEEPALIVE_INTERVAL, pong_timeout: float = PONG_TIMEOUT,
            reconnect: bool = True, write_retry_for: float = WRITE_RETRY_FOR) -> Client:
    """Connect to an exec server (blocking). The arguments are those of `aio.connect`."""
    cb = _Callbacks()
    approval: Optional[Callable[[ApprovalRequest], Any]] = None
    if on_approval is not None:
        handler = on_approval

        def ask(req: ApprovalRequest) -> "asyncio.Future[Any]":
            return cb.call_sync(handler, req)
        approval = ask

    async def make() -> aio.Client:
        return await aio.connect(target, server_key=server_key, key=key, token=token,
                                 ca_file=ca_file, binary=binary, on_approval=approval,
                                 session_ttl=session_ttl, noise_suite=noise_suite,
                                 noise_window=noise_window,
                                 keepalive_interval=keepalive_interval,
                                 pong_timeout=pong_timeout, reconnect=reconnect,
                                 write_retry_for=write_retry_for,
                                 _callback_runner=cb.submit)

    try:
        inner = _run(make())
    except BaseException:
        cb.stop()
        raise
    return Client(inner, cb)
