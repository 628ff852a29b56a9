"""Physical links and virtual streams (secure-transport.md §3-§7), on asyncio.

Owns: the 44-byte frame header, one WebSocket link carrying many streams, each stream's Noise
handshake (`OPEN`/`ACCEPT`), its records (explicit nonces, kind byte, authenticated close),
length-prefixed messages across records, and flow control both ways (never send past the
peer's `ack + window`; report what was consumed with a bare `ACK` every half window, or every
8 records if fewer).
Keepalive is the WebSocket's own ping (every `keepalive_interval`, dead after
`pong_timeout`), and every write has the same deadline.

Must never: send application data before message 2 verified; send a record past the peer's
window; hand out a message twice or skip one; let one stream's failure end another's.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import struct
import time
from typing import Any, Dict, List, Optional, Tuple

from ._noise import (
    SUITE_CHACHAPOLY,
    CipherState,
    InitiatorHandshake,
    NoiseError,
)

HEADER = struct.Struct("!BBH16sQQII")
FRAME_VERSION = 1
OPEN, ACCEPT, DATA, ACK, RESET, RESUME = 1, 2, 3, 4, 5, 6
MAX_FRAME_BYTES = 44 + 65535
MAX_RESET_REASON = 256
KIND_STREAM = 0
KIND_CLOSE = 1
#: Plaintext bytes of one record: 65,535 - 16 (tag) - 1 (kind byte).
MAX_RECORD_BODY = 65535 - 16 - 1
#: Records past what we consumed that we accept from the server (the relay honours up to 64).
DEFAULT_WINDOW = 32
#: What we consumed is reported at least every this many records, whatever our window: a relay
#: passes on a window clipped to its `max_window_records` (at least 8), and a sender held to
#: that would never see the ACK of half of ours (README: "Windows: … the relay's clip").
ACK_EVERY_RECORDS = 8
PROLOGUE_PREFIX = b"execrelay/noise/v1"
MAX_HANDSHAKE_PAYLOAD = 4096
#: Keepalive defaults (secure-transport.md §6.4).
KEEPALIVE_INTERVAL = 15.0
PONG_TIMEOUT = 30.0
#: How long an `OPEN` may wait for its `ACCEPT` or `RESET`.
OPEN_TIMEOUT = 20.0

_last_ts = 0


def next_hello_ts() -> int:
    """Microseconds since the epoch, strictly increasing within this process."""
    global _last_ts
    now = time.time_ns() // 1000
    _last_ts = max(now, _last_ts + 1)
    return _last_ts


class LinkError(Exception):
    """The link or a stream failed. `reason` is the peer's RESET reason or a local cause."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class StreamReset(LinkError):
    """A `RESET` ended the stream (unauthenticated: the path is gone)."""


class StreamClosed(LinkError):
    """The server closed the stream with an authenticated close record."""


def encode_frame(ftype: int, stream: bytes, payload: bytes = b"", seq: int = 0, ack: int = 0,
                 window: int = 0, flags: int = 0) -> bytes:
    return HEADER.pack(FRAME_VERSION, ftype, flags, stream, seq, ack, 0, window) + payload


def decode_frame(msg: bytes) -> Tuple[int, bytes, int, int, int, memoryview]:
    """(type, stream id, seq, ack, window, payload); LinkError for a malformed frame."""
    if len(msg) < HEADER.size:
        raise LinkError(f"frame of {len(msg)} bytes is shorter than its 44-byte header",
                        "malformed_frame")
    if len(msg) > MAX_FRAME_BYTES:
        raise LinkError(f"frame of {len(msg)} bytes is over the limit", "malformed_frame")
    version, ftype, flags, stream, seq, ack, _bits, window = HEADER.unpack_from(msg)
    if version != FRAME_VERSION:
        raise LinkError(f"frame version {version}", "malformed_frame")
    if ftype < OPEN or ftype > RESUME:
        raise LinkError(f"unknown frame type {ftype}", "malformed_frame")
    return ftype, stream, seq, ack, window, memoryview(msg)[HEADER.size:]


def prologue(environment: str, stream_id: bytes) -> bytes:
    env = environment.encode("utf-8")
    return (PROLOGUE_PREFIX + len(env).to_bytes(2, "big") + env
            + len(stream_id).to_bytes(2, "big") + stream_id)


async def open_websocket(url: str, *, max_size: int, ca_file: Optional[str],
                         keepalive_interval: float, pong_timeout: float,
                         open_timeout: float = 20.0):
    """A WebSocket client connection with keepalive, no compression and no Origin header."""
    from websockets.asyncio.client import connect

    kwargs: Dict[str, Any] = dict(
        max_size=max_size,
        compression=None,
        ping_interval=keepalive_interval,
        ping_timeout=pong_timeout,
        close_timeout=2,
        open_timeout=open_timeout,
        max_queue=64,
        user_agent_header=None,
    )
    if url.startswith("wss://"):
        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        kwargs["ssl"] = ctx
    try:
        return await connect(url, proxy=None, **kwargs)
    except TypeError:  # websockets < 15 has no `proxy` argument
        return await connect(url, **kwargs)


class Stream:
    """One virtual stream: length-prefixed messages over Noise records, flow-controlled."""

    def __init__(self, link: "Link", stream_id: bytes, window: int) -> None:
        self.link = link
        self.id = stream_id
        self._window = window
        self._send: Optional[CipherState] = None
        self._recv: Optional[CipherState] = None
        self._next_send = 1
        self._peer_ack = 0
        self._peer_window = 0
        self._credit = asyncio.Event()
        self._recv_seq = 0  # highest DATA record received
        self._consumed = 0  # highest record handed to the application
        self._reported = 0  # last `ack` we sent
        self._frames: "asyncio.Queue[Optional[Tuple[int, bytes]]]" = asyncio.Queue()
        self._buf = bytearray()
        self._messages: List[bytes] = []
        self.failure: Optional[LinkError] = None
        self._accepted: "asyncio.Future[bytes]" = asyncio.get_running_loop().create_future()
        self._send_lock = asyncio.Lock()
        self.max_message = link.max_message
        #: The Noise suite this stream's handshake used.
        self.suite = SUITE_CHACHAPOLY

    # Called by the link's reader -----------------------------------------------------------

    def _on_frame(self, ftype: int, seq: int, ack: int, window: int, payload: memoryview) -> None:
        if ftype == ACCEPT:
            if not self._accepted.done():
                self._peer_ack, self._peer_window = ack, window
                self._accepted.set_result(bytes(payload))
            return
        if ftype == RESET:
            reason = bytes(payload[:MAX_RESET_REASON]).decode("utf-8", "replace")
            self._fail(StreamReset(f"stream reset by the peer: {reason}", reason))
            return
        if ftype in (DATA, ACK):
            self._update_credit(ack, window)
        if ftype == DATA:
            if seq != self._recv_seq + 1:
                self._fail(LinkError(f"record {seq} out of order (expected {self._recv_seq + 1})",
                                     "malformed_frame"), reset=True)
                return
            if seq > self._consumed + self._window:
                self._fail(LinkError("the server sent past our window", "window_exceeded"),
                           reset=True)
                return
            self._recv_seq = seq
            self._frames.put_nowait((seq, bytes(payload)))

    def _update_credit(self, ack: int, window: int) -> None:
        if ack >= self._peer_ack:
            self._peer_ack, self._peer_window = ack, window
            self._credit.set()

    def _fail(self, err: LinkError, reset: bool = False) -> None:
        if self.failure is not None:
            return
        self.failure = err
        if not self._accepted.done():
            self._accepted.set_exception(err)
            self._accepted.exception()  # retrieved here: the opener raises self.failure
        self._frames.put_nowait(None)
        self._credit.set()
        self.link._streams.pop(self.id, None)
        if reset:
            self.link._send_nowait(encode_frame(RESET, self.id, err.reason.encode()[:256]))

    # Handshake -----------------------------------------------------------------------------

    async def handshake(self, hs: InitiatorHandshake, payload: bytes, suite: int,
                        timeout: float = OPEN_TIMEOUT) -> dict:
        msg1 = hs.write_message_1(payload)
        await self.link.send_frame(encode_frame(OPEN, self.id, msg1, window=self._window,
                                                flags=suite))
        try:
            msg2 = await asyncio.wait_for(asyncio.shield(self._accepted), timeout)
        except asyncio.TimeoutError:
            self._fail(LinkError("no answer to the handshake", "timeout"), reset=True)
            raise self.failure  # type: ignore[misc]
        try:
            reply = hs.read_message_2(msg2)
        except NoiseError as e:
            self._fail(LinkError(f"the server's handshake did not verify: {e}", "handshake_failed"),
                       reset=True)
            raise self.failure  # type: ignore[misc]
        self._send, self._recv = hs.split()
        try:
            info = json.loads(reply.decode("utf-8")) if reply else {}
        except ValueError:
            info = {}
        return info if isinstance(info, dict) else {}

    # Messages ------------------------------------------------------------------------------

    async def send_message(self, body: bytes) -> None:
        """Send one length-prefixed message (cut into records, each waiting for credit)."""
        data = len(body).to_bytes(4, "big") + body
        async with self._send_lock:
            for at in range(0, len(data), MAX_RECORD_BODY):
                await self._send_record(KIND_STREAM, data[at:at + MAX_RECORD_BODY])

    async def _send_record(self, kind: int, body: bytes) -> None:
        if self.failure is not None:
            raise self.failure
        seq = self._next_send
        while seq > self._peer_ack + self._peer_window:
            if self.failure is not None:
                raise self.failure
            self._credit.clear()
            await self._credit.wait()
        if self.failure is not None:
            raise self.failure
        assert self._send is not None
        ct = self._send.seal(seq, bytes([kind]) + body)
        self._next_send = seq + 1
        self._reported = self._consumed
        await self.link.send_frame(encode_frame(DATA, self.id, ct, seq=seq, ack=self._consumed,
                                                window=self._window))

    async def recv_message(self) -> bytes:
        """The next message; LinkError when the stream ended."""
        while True:
            if self._messages:
                return self._messages.pop(0)
            item = await self._frames.get()
            if item is None:
                self._frames.put_nowait(None)
                assert self.failure is not None
                raise self.failure
            seq, ct = item
            assert self._recv is not None
            try:
                pt = self._recv.open(seq, ct)
            except NoiseError:
                self._fail(LinkError("a record did not decrypt", "bad_record"), reset=True)
                raise self.failure  # type: ignore[misc]
            if not pt:
                self._fail(LinkError("empty record", "bad_record"), reset=True)
                raise self.failure  # type: ignore[misc]
            if pt[0] == KIND_CLOSE:
                reason = pt[1:257].decode("utf-8", "replace")
                self._fail(StreamClosed(f"the server closed the stream: {reason}", reason))
                raise self.failure  # type: ignore[misc]
            if pt[0] != KIND_STREAM:
                self._fail(LinkError(f"unknown record kind {pt[0]}", "bad_record"), reset=True)
                raise self.failure  # type: ignore[misc]
            self._buf += memoryview(pt)[1:]
            self._split_messages()
            self._consumed = seq
            if self._consumed - self._reported >= max(1, min(self._window // 2,
                                                             ACK_EVERY_RECORDS)):
                self._reported = self._consumed
                self.link._send_nowait(encode_frame(ACK, self.id, ack=self._consumed,
                                                    window=self._window))

    def _split_messages(self) -> None:
        buf = self._buf
        at = 0
        while len(buf) - at >= 4:
            n = int.from_bytes(buf[at:at + 4], "big")
            if n == 0 or n > self.max_message:
                self._fail(LinkError(f"message length {n} out of bounds", "bad_record"),
                           reset=True)
                raise self.failure  # type: ignore[misc]
            if len(buf) - at - 4 < n:
                break
            self._messages.append(bytes(buf[at + 4:at + 4 + n]))
            at += 4 + n
        if at:
            del buf[:at]

    async def close(self, reason: str = "closed") -> None:
        """Close on purpose: the authenticated close record, then `RESET`."""
        if self.failure is None and self._send is not None:
            try:
                await asyncio.wait_for(self._send_record(KIND_CLOSE, reason.encode()[:256]), 2)
            except (LinkError, asyncio.TimeoutError, OSError):
                pass
        if self.failure is None:
            self._fail(StreamClosed("closed by the client", "closed"), reset=True)


#: How long a suite-1 `OPEN` waits for an answer from a server not yet known to accept it
#: (a server from before suites drops such an `OPEN` without a word).
SUITE_PROBE_TIMEOUT = 2.0
#: Per link URL: whether its server took suite 1 (True) or refused it (False), so only the
#: first stream of this process to a server probes. Bounded: the oldest verdict goes first.
_SUITE_VERDICTS: Dict[str, bool] = {}
MAX_SUITE_VERDICTS = 1024


def _remember_suite_verdict(url: str, ok: bool) -> None:
    _SUITE_VERDICTS.pop(url, None)
    _SUITE_VERDICTS[url] = ok
    while len(_SUITE_VERDICTS) > MAX_SUITE_VERDICTS:
        _SUITE_VERDICTS.pop(next(iter(_SUITE_VERDICTS)))


class Link:
    """One physical link (a WebSocket of binary frames) and its streams."""

    def __init__(self, ws, environment: str, max_message: int, pong_timeout: float,
                 url: str = "") -> None:
        self.url = url
        self.ws = ws
        self.environment = environment
        self.max_message = max_message
        self.pong_timeout = pong_timeout
        self.loop = asyncio.get_running_loop()
        self._streams: Dict[bytes, Stream] = {}
        self.closed: Optional[LinkError] = None
        self.suite_refused = False  # the server refused suite 1 once: use 0 from then on
        self._reader = self.loop.create_task(self._read())
        self._pending_sends: "set[asyncio.Task]" = set()

    @classmethod
    async def connect(cls, url: str, environment: str, *, ca_file: Optional[str],
                      max_message: int, keepalive_interval: float,
                      pong_timeout: float) -> "Link":
        ws = await open_websocket(url, max_size=MAX_FRAME_BYTES, ca_file=ca_file,
                                  keepalive_interval=keepalive_interval,
                                  pong_timeout=pong_timeout)
        return cls(ws, environment, max_message, pong_timeout, url)

    async def _read(self) -> None:
        why = LinkError("the link closed", "link_closed")
        try:
            async for msg in self.ws:
                if isinstance(msg, str):
                    why = LinkError("the server sent a text message on a link", "protocol")
                    break
                try:
                    ftype, sid, seq, ack, window, payload = decode_frame(msg)
                except LinkError:
                    continue  # a malformed frame is dropped
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._on_frame(ftype, seq, ack, window, payload)
        except Exception as e:  # noqa: BLE001 - any transport failure ends the link
            why = LinkError(f"the link failed: {e}", "link_closed")
        self._close_all(why)

    def _close_all(self, why: LinkError) -> None:
        if self.closed is None:
            self.closed = why
        for s in list(self._streams.values()):
            s._fail(LinkError(str(why), why.reason))
        self._streams.clear()

    async def send_frame(self, frame: bytes) -> None:
        if self.closed is not None:
            raise LinkError(str(self.closed), self.closed.reason)
        try:
            await asyncio.wait_for(self.ws.send(frame), self.pong_timeout)
        except asyncio.TimeoutError:
            await self.abort("a write took longer than the pong timeout")
            raise LinkError("write deadline passed", "link_closed") from None
        except Exception as e:  # noqa: BLE001
            self._close_all(LinkError(f"the link failed: {e}", "link_closed"))
            raise LinkError(f"the link failed: {e}", "link_closed") from None

    def _send_nowait(self, frame: bytes) -> None:
        if self.closed is not None:
            return
        t = self.loop.create_task(self._send_quiet(frame))
        self._pending_sends.add(t)
        t.add_done_callback(self._pending_sends.discard)

    async def _send_quiet(self, frame: bytes) -> None:
        try:
            await self.send_frame(frame)
        except LinkError:
            pass

    async def open_stream(self, static_private: bytes, server_public: bytes, suite: int,
                          token: Optional[str], window: int = DEFAULT_WINDOW,
                          fallback: bool = True) -> Tuple[Stream, dict]:
        """Open a stream: handshake with `suite`, falling back to suite 0 when refused (unless
        `fallback` is False: a pinned suite)."""
        if fallback and (self.suite_refused or _SUITE_VERDICTS.get(self.url) is False):
            suite = SUITE_CHACHAPOLY
        while True:
            sid = os.urandom(16)
            stream = Stream(self, sid, window)
            self._streams[sid] = stream
            hello: Dict[str, Any] = {"version": 1, "ts": next_hello_ts()}
            if token is not None:
                hello["token"] = token
            payload = json.dumps(hello, separators=(",", ":")).encode()
            if len(payload) > MAX_HANDSHAKE_PAYLOAD:
                raise ValueError("the token is too long for a handshake payload")
            hs = InitiatorHandshake(suite, static_private, server_public,
                                    prologue(self.environment, sid))
            probing = suite != SUITE_CHACHAPOLY and _SUITE_VERDICTS.get(self.url) is not True
            try:
                info = await stream.handshake(hs, payload, suite,
                                              SUITE_PROBE_TIMEOUT if probing else OPEN_TIMEOUT)
                if suite != SUITE_CHACHAPOLY:
                    _remember_suite_verdict(self.url, True)
                stream.suite = suite
                return stream, info
            except LinkError as e:
                # A server without suite 1 resets `unsupported_suite`; one from before suites
                # existed drops the OPEN as malformed (no answer at all). Either way: suite 0
                # from then on, for every link to that URL in this process.
                refused = isinstance(e, StreamReset) and e.reason in ("unsupported_suite",
                                                                      "malformed_frame")
                if suite != SUITE_CHACHAPOLY and (refused or (probing and e.reason == "timeout")):
                    if not fallback:
                        raise LinkError(f"the server does not take Noise suite {suite} "
                                        f"({e.reason or 'no answer'})", "unsupported_suite") from None
                    self.suite_refused = True
                    _remember_suite_verdict(self.url, False)
                    suite = SUITE_CHACHAPOLY
                    continue
                raise

    @property
    def alive(self) -> bool:
        return self.closed is None

    async def abort(self, why: str = "closed") -> None:
        self._close_all(LinkError(why, "link_closed"))
        try:
            transport = getattr(self.ws, "transport", None)
            if transport is not None:
                transport.abort()
        except Exception:  # noqa: BLE001
            pass

    async def close(self) -> None:
        self._close_all(LinkError("closed by the client", "closed"))
        try:
            await asyncio.wait_for(self.ws.close(), 2)
        except Exception:  # noqa: BLE001
            pass
        self._reader.cancel()
