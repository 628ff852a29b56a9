"""A fault-injecting TCP proxy for the conformance kit and the Python package's tests.

Standard library only. It listens on 127.0.0.1 (port 0), forwards every connection to one
upstream address, and on command:

- `cut()`: aborts every connection it carries (both sockets reset at once, as a dead network
  path looks to the ends once they notice);
- `cut_after_down(n)`: cuts a connection once `n` bytes went server → client on it (a link
  lost in the middle of output), one time;
- `cut_after_up(n)`: the same for client → server bytes (a link lost in the middle of a write);
- `blackhole(True)`: keeps the connections open now and forwards nothing on them either way
  (a path that died without a FIN or RST: only keepalive can tell); new connections flow;
- `refuse(True)`: new connections are closed at once (the server is unreachable).

It counts connections and bytes each way. It runs on its own thread and event loop, so
blocking tests and asyncio tests can both drive it; every method is thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional, Set

CHUNK = 64 * 1024


class FaultProxy:
    """See the module documentation."""

    def __init__(self, upstream_host: str, upstream_port: int, ssl_context: Any = None) -> None:
        """`ssl_context`: terminate TLS on the listening side (a `wss://` front)."""
        self.upstream = (upstream_host, upstream_port)
        self._ssl = ssl_context
        self.connections = 0
        self.bytes_down = 0
        self.bytes_up = 0
        self.cuts = 0
        self._refuse = False
        self._cut_down_at: Optional[int] = None
        self._cut_up_at: Optional[int] = None
        self._cut_down_every = 0
        self._cut_down_left = 0
        self._pairs: Set["_Pair"] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: Optional[asyncio.base_events.Server] = None
        self.port = 0
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self._ssl)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    def url(self, scheme: str, path: str = "") -> str:
        """`scheme://127.0.0.1:PORT` + `path`, pointing at the proxy."""
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse:
            writer.transport.abort()
            return
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        pair = _Pair(self, writer, uw)
        self._pairs.add(pair)
        try:
            await asyncio.gather(pair.pump(reader, uw, down=False),
                                 pair.pump(ur, writer, down=True), return_exceptions=True)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        self._pairs.discard(pair)

    def _call(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def cut(self) -> None:
        """Abort every connection now."""
        self._call(self._cut_all)

    def _cut_all(self) -> None:
        self.cuts += 1
        for p in list(self._pairs):
            p.abort()

    def cut_after_down(self, n: int, times: int = 1) -> None:
        """Cut once `n` more bytes went server → client (on any connection); with `times`,
        again after each further `n` bytes, that many times in all."""
        def arm() -> None:
            self._cut_down_every = n
            self._cut_down_left = times - 1
            self._cut_down_at = self.bytes_down + n
        self._call(arm)

    def cut_after_up(self, n: int) -> None:
        """Cut once `n` more bytes went client → server."""
        def arm() -> None:
            self._cut_up_at = self.bytes_up + n
        self._call(arm)

    def blackhole(self, on: bool) -> None:
        """Stop forwarding on every connection open now, without closing anything (new
        connections flow); `False` lets them flow again."""
        def flip() -> None:
            for p in list(self._pairs):
                p.black = on
        self._call(flip)

    def refuse(self, on: bool) -> None:
        """Close new connections at once (True) or forward them again (False)."""
        def flip() -> None:
            self._refuse = on
        self._call(flip)

    @property
    def live(self) -> int:
        """Connections being forwarded now."""
        return len(self._pairs)

    def close(self) -> None:
        """Stop listening, abort everything, and stop the proxy's thread."""
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for p in list(self._pairs):
                p.abort()  # blackholed ones too
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class _Pair:
    def __init__(self, proxy: FaultProxy, client_w: asyncio.StreamWriter,
                 upstream_w: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.writers = [client_w, upstream_w]
        self.dead = False
        self.black = False

    def abort(self) -> None:
        self.dead = True
        for w in self.writers:
            try:
                w.transport.abort()
            except Exception:  # noqa: BLE001
                pass

    async def pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, down: bool) -> None:
        proxy = self.proxy
        try:
            while not self.dead:
                data = await r.read(CHUNK)
                if not data:
                    break
                if self.black:
                    continue  # the path lost them
                if down:
                    limit = proxy._cut_down_at
                    if limit is not None and proxy.bytes_down + len(data) >= limit:
                        keep = max(0, limit - proxy.bytes_down)
                        proxy.bytes_down += keep
                        w.write(data[:keep])
                        proxy._cut_down_at = None
                        if proxy._cut_down_left > 0:
                            proxy._cut_down_left -= 1
                            proxy._cut_down_at = proxy.bytes_down + proxy._cut_down_every
                        proxy._cut_all()
                        break
                    proxy.bytes_down += len(data)
                else:
                    limit = proxy._cut_up_at
                    if limit is not None and proxy.bytes_up + len(data) >= limit:
                        keep = max(0, limit - proxy.bytes_up)
                        proxy.bytes_up += keep
                        w.write(data[:keep])
                        proxy._cut_up_at = None
                        proxy._cut_all()
                        break
                    proxy.bytes_up += len(data)
                w.write(data)
                await w.drain()
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            # A blackholed path stays half-open: the other end never learns of this one's
            # close (until the proxy closes).
            if not self.black:
                self.abort()
