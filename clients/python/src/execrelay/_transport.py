"""One connection's message transport: a plain WebSocket, or a Noise stream on a link.

Owns: sending a JSON text or a binary message and receiving the next message, the same way
on both carriers (`protocol.md` §1, §5.1, §5.2). Knows nothing of JSON-RPC.
"""

from __future__ import annotations

from typing import Optional, Union

from ._link import Link, LinkError, Stream, open_websocket


class TransportClosed(Exception):
    """The transport ended; `reason` is the peer's reason where it gave one."""

    def __init__(self, message: str, reason: str = "", code: Optional[int] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


class WsTransport:
    """`ws://`: one JSON-RPC connection per WebSocket; JSON in text frames, binary in binary."""

    def __init__(self, ws) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, url: str, *, max_message: int, keepalive_interval: float,
                      pong_timeout: float) -> "WsTransport":
        ws = await open_websocket(url, max_size=max_message + 1024, ca_file=None,
                                  keepalive_interval=keepalive_interval,
                                  pong_timeout=pong_timeout)
        t = cls(ws)
        t.pong_timeout = pong_timeout
        return t

    pong_timeout = 30.0

    async def send(self, msg: Union[str, bytes]) -> None:
        import asyncio

        try:
            await asyncio.wait_for(self.ws.send(msg), self.pong_timeout)
        except asyncio.TimeoutError:
            await self.abort()
            raise TransportClosed("a write took longer than the pong timeout") from None
        except Exception as e:  # noqa: BLE001
            raise self._closed(e) from None

    async def recv(self) -> Union[str, bytes]:
        try:
            return await self.ws.recv()
        except Exception as e:  # noqa: BLE001
            raise self._closed(e) from None

    def _closed(self, e: Exception) -> TransportClosed:
        rcvd = getattr(e, "rcvd", None)
        if rcvd is not None:
            return TransportClosed(f"the server closed the connection: {rcvd.reason or rcvd.code}",
                                   rcvd.reason or "", rcvd.code)
        return TransportClosed(f"the connection failed: {e}")

    async def abort(self) -> None:
        tr = getattr(self.ws, "transport", None)
        if tr is not None:
            tr.abort()

    async def close(self) -> None:
        import asyncio

        try:
            await asyncio.wait_for(self.ws.close(), 2)
        except Exception:  # noqa: BLE001
            await self.abort()


class NoiseTransport:
    """A virtual stream: each message length-prefixed inside Noise records."""

    def __init__(self, link: Link, stream: Stream) -> None:
        self.link = link
        self.stream = stream

    async def send(self, msg: Union[str, bytes]) -> None:
        body = msg.encode("utf-8") if isinstance(msg, str) else msg
        try:
            await self.stream.send_message(body)
        except LinkError as e:
            raise TransportClosed(str(e), e.reason) from None

    async def recv(self) -> bytes:
        try:
            return await self.stream.recv_message()
        except LinkError as e:
            raise TransportClosed(str(e), e.reason) from None

    async def abort(self) -> None:
        await self.link.abort("aborted")

    async def close(self) -> None:
        await self.stream.close("closed")
