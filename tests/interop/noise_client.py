#!/usr/bin/env python3
"""Independent Noise client for execrelay's `noise+ws://` listener (interoperability check).

Written from the specification only (`secure-transport.md` §1-§5, §8 and `protocol.md` §1,
§3, §5.1), with a different Noise implementation (the `noiseprotocol` package) from the
server's, so that a misreading of the spec shared by the server and the Rust client shows up
here.

Usage:
    python3 noise_client.py URL SERVER_PUBKEY_FILE CLIENT_PRIVKEY_FILE
                            [--token T] [--ts-offset-seconds S] [--binary-output]
                            [--mode ok|replay-on-other-stream|replay-on-other-link]

--binary-output asks for output deltas as binary messages (`protocol.md` §5.1,
`capabilities.binaryOutput`) and runs `echo interop-ok; echo interop-err >&2` under a
non-ASCII process id, decoding every binary delta from the layout of §5.1.

--ts-offset-seconds S adds S seconds to the `ts` of every message 1 (a client whose clock
is off); the server refuses more than 2 minutes either way, or earlier than its start (§3).

URL is `noise+ws://HOST:PORT`; the client connects a WebSocket to `ws://HOST:PORT/v1/link`.

Output, one event per line on stdout:
    --mode ok (default):
        INITIALIZE_RESULT {json}     the `initialize` result, compact JSON on one line
        OUTPUT <text>                each stdout chunk of `echo interop-ok`, decoded
        STDERR <text>                each stderr chunk (with --binary-output)
        FORM <binary|json> <seq> <stream>  how each output delta arrived (with --binary-output)
        EXITED <exitCode>            on `process/exited`
      exit status 0.
    --mode replay-on-other-stream:
        REPLAY_RESULT <type>         the frame type the server answered to a replayed
                                     handshake message 1 on a second stream (5 = RESET)
        INITIALIZE_RESULT {json}     the first stream still works afterwards
      exit status 0 if the replay was reset, 1 if it was accepted.
    --mode replay-on-other-link:
        REPLAY_RESULT <type> <reason>  the answer to stream A's message 1 replayed, with A's
                                     own stream id, on a second link (5 = RESET, and its
                                     reason; the prologue matches, so only `ts` can refuse it)
        INITIALIZE_RESULT {json}     the first stream still works afterwards
      exit status 0 if the replay was reset, 1 if it was accepted.
    On any failure (RESET on our stream, handshake failure, protocol violation, 20 s
    timeout): `ERROR <reason>` and exit status 2.
"""

import argparse
import base64
import json
import os
import struct
import sys
import time

try:
    from noise.connection import Keypair, NoiseConnection
    from noise.exceptions import NoiseInvalidMessage
    import websockets.sync.client
    from websockets.exceptions import ConnectionClosed
except ImportError as e:  # pragma: no cover - reported, not handled
    print(
        f"ERROR missing Python package ({e}); run "
        "`python3 -m pip install -r tests/interop/requirements.txt`",
        flush=True,
    )
    sys.exit(2)

# ---------------------------------------------------------------------------------------------
# Constants from the specification
# ---------------------------------------------------------------------------------------------

# secure-transport.md §3: the suites by the number the client writes in bits 0-1 of its OPEN
# frame's flags. The record nonce layout follows the suite's Noise cipher (noiseprotocol's own:
# ChaChaPoly little-endian, AESGCM big-endian), which is what the server must match.
NOISE_PROTOCOLS = {
    0: b"Noise_IK_25519_ChaChaPoly_BLAKE2s",
    1: b"Noise_IK_25519_AESGCM_BLAKE2s",
}
SUITE = 0  # set by --suite
PROLOGUE_PREFIX = b"execrelay/noise/v1"  # §3
LINK_PATH = "/v1/link"  # §1: a noise+ws:// listener accepts physical links there

# §5 frame header: version u8, type u8, flags u16, stream id 16 bytes, seq u64, ack u64,
# ack bits u32, window u32; all big-endian ("!" = network order, no padding) = 44 bytes.
HEADER = struct.Struct("!BBH16sQQII")
assert HEADER.size == 44
FRAME_VERSION = 1
OPEN, ACCEPT, DATA, ACK, RESET, RESUME = 1, 2, 3, 4, 5, 6
FRAME_NAMES = {OPEN: "OPEN", ACCEPT: "ACCEPT", DATA: "DATA", ACK: "ACK", RESET: "RESET",
               RESUME: "RESUME"}
MAX_FRAME_BYTES = 44 + 65535

# §4 records: one kind byte, then the body. The Noise message limit is 65,535 bytes, of which
# 16 are the ChaChaPoly tag and 1 the kind byte.
KIND_STREAM = 0
KIND_CLOSE = 1
MAX_RECORD_PLAINTEXT = 65535 - 16 - 1

# How many records past our cumulative ack we accept (§5 `window`); the brief asks for 64.
WINDOW = 64

TIMEOUT_S = 20.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # protocol.md §1 default

# protocol.md §5.1: a binary output message. Integers big-endian: kind u8 (0 = output delta),
# stream u8 (0 stdout, 1 stderr, 2 pty), seq u64, process id length u16 (1..256), the process
# id (UTF-8), then the raw chunk (1..MAX_CHUNK_BYTES bytes).
BINARY_HEAD = struct.Struct("!BBQH")
assert BINARY_HEAD.size == 12
KIND_OUTPUT_DELTA = 0
BINARY_STREAMS = {0: "stdout", 1: "stderr", 2: "pty"}
MAX_PROCESS_ID_BYTES = 256
MAX_CHUNK_BYTES = 64 * 1024


class Failure(Exception):
    """Anything that makes the run fail: printed as `ERROR <reason>`, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Keys (secure-transport.md §2)
# ---------------------------------------------------------------------------------------------


def _b64_key(text, what):
    """Decode a base64 X25519 key (standard alphabet; URL-safe and unpadded tolerated)."""
    text = text.strip()
    padded = text + "=" * (-len(text) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            raw = decode(padded.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            continue
        if len(raw) == 32:
            return raw
    raise Failure(f"{what}: not a base64 32-byte X25519 key")


def load_public_key(path):
    """`NAME.pub` is one line `execrelay-x25519 <base64> <comment>`."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if fields[0] != "execrelay-x25519" or len(fields) < 2:
                raise Failure(f"{path}: expected `execrelay-x25519 <base64> <comment>`")
            return _b64_key(fields[1], path)
    raise Failure(f"{path}: no public key line")


def load_private_key(path):
    """The private key file holds the base64 of the 32-byte X25519 secret."""
    with open(path, encoding="utf-8") as f:
        return _b64_key(f.read(), path)


# ---------------------------------------------------------------------------------------------
# Frames (secure-transport.md §5)
# ---------------------------------------------------------------------------------------------


def encode_frame(ftype, stream_id, payload=b"", seq=0, ack=0, ack_bits=0, window=WINDOW,
                 flags=0):
    """One frame = one binary WebSocket message: the 44-byte header, then the payload."""
    frame = HEADER.pack(FRAME_VERSION, ftype, flags, stream_id, seq, ack, ack_bits,
                        window) + payload
    assert len(frame) <= MAX_FRAME_BYTES
    return frame


class Frame:
    __slots__ = ("ftype", "stream_id", "seq", "ack", "ack_bits", "window", "payload")

    def __init__(self, data):
        if len(data) < HEADER.size:
            raise Failure(f"frame of {len(data)} bytes is shorter than the 44-byte header")
        version, self.ftype, flags, self.stream_id, self.seq, self.ack, self.ack_bits, \
            self.window = HEADER.unpack_from(data)
        if version != FRAME_VERSION:
            raise Failure(f"frame version {version}, expected {FRAME_VERSION}")
        if flags != 0:
            raise Failure(f"frame flags {flags:#x}, expected 0")
        self.payload = bytes(data[HEADER.size:])

    @property
    def name(self):
        return FRAME_NAMES.get(self.ftype, f"type {self.ftype}")

    def reset_reason(self):
        return self.payload.decode("utf-8", "replace")


class Link:
    """A physical link: a WebSocket carrying binary frames, many streams multiplexed on it.

    Frames for streams other than the one being waited on are queued for later, so a
    stream's wait never loses another stream's frame."""

    def __init__(self, url, deadline):
        self.deadline = deadline
        ws_url = link_url(url)
        try:
            # No Origin header (the listener refuses upgrades that carry one, §1), no proxy from
            # the environment (the server is local), no compression (payloads are ciphertext),
            # and room for the largest frame. The receive queue is unbounded so that frames
            # left unread at the end (ACKs, retransmissions) never hold up the closing
            # handshake, which gets a short timeout anyway.
            self.ws = websockets.sync.client.connect(
                ws_url,
                origin=None,
                proxy=None,
                compression=None,
                max_size=MAX_FRAME_BYTES,
                max_queue=None,
                open_timeout=self.remaining(),
                close_timeout=2,
            )
        except Exception as e:  # noqa: BLE001 - any connect failure is a test failure
            raise Failure(f"cannot connect to {ws_url}: {e!r}") from e
        self.queued = {}

    def remaining(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Failure(f"timed out after {TIMEOUT_S:.0f} s")
        return left

    def send(self, frame_bytes):
        try:
            self.ws.send(frame_bytes)  # bytes -> a binary message
        except ConnectionClosed as e:
            raise Failure(f"link closed while sending: {e}") from e

    def _recv_frame(self):
        try:
            data = self.ws.recv(timeout=self.remaining())
        except TimeoutError as e:
            raise Failure(f"timed out after {TIMEOUT_S:.0f} s waiting for a frame") from e
        except ConnectionClosed as e:
            raise Failure(f"link closed by the server: {e}") from e
        if isinstance(data, str):
            raise Failure("server sent a text WebSocket message (frames are binary)")
        return Frame(data)

    def next_frame(self, stream_id):
        """The next frame on `stream_id`."""
        queue = self.queued.get(stream_id)
        if queue:
            return queue.pop(0)
        while True:
            frame = self._recv_frame()
            if frame.stream_id == stream_id:
                return frame
            self.queued.setdefault(frame.stream_id, []).append(frame)

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - best effort at the end
            pass


def link_url(url):
    """`noise+ws://HOST:PORT` -> `ws://HOST:PORT/v1/link`."""
    scheme = "noise+ws://"
    if not url.startswith(scheme):
        raise Failure(f"URL must start with {scheme}: {url!r}")
    authority = url[len(scheme):].rstrip("/")
    if not authority or "/" in authority:
        raise Failure(f"URL must be noise+ws://HOST:PORT: {url!r}")
    return f"ws://{authority}{LINK_PATH}"


# ---------------------------------------------------------------------------------------------
# Handshake (secure-transport.md §3)
# ---------------------------------------------------------------------------------------------


def prologue(environment_id, stream_id):
    """`execrelay/noise/v1`, then for the environment id (UTF-8, empty for a direct connection)
    and for the 16-byte stream id: a 2-byte big-endian length and the bytes."""
    env = environment_id.encode("utf-8")
    return (PROLOGUE_PREFIX
            + struct.pack("!H", len(env)) + env
            + struct.pack("!H", len(stream_id)) + stream_id)


class HelloClock:
    """The `ts` of message 1 (§3): microseconds since the Unix epoch, raised by at least one
    for every handshake this client makes, shifted by `offset_s` to play a wrong clock."""

    def __init__(self, offset_s=0.0):
        self.offset_us = int(offset_s * 1_000_000)
        self.last = 0

    def next(self):
        now = time.time_ns() // 1000 + self.offset_us
        self.last = max(now, self.last + 1)
        return self.last


HELLO_CLOCK = HelloClock()


def handshake_payload(token):
    payload = {"version": 1, "ts": HELLO_CLOCK.next()}
    if token is not None:
        payload["token"] = token
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


class Stream:
    """One virtual stream: its Noise session, record numbering and JSON-RPC reassembly."""

    def __init__(self, link, client_private, server_public, environment_id=""):
        self.link = link
        self.stream_id = os.urandom(16)  # random, chosen by the client (§5)
        self.noise = NoiseConnection.from_name(NOISE_PROTOCOLS[SUITE])
        self.noise.set_as_initiator()
        self.noise.set_prologue(prologue(environment_id, self.stream_id))
        self.noise.set_keypair_from_private_bytes(Keypair.STATIC, client_private)
        self.noise.set_keypair_from_public_bytes(Keypair.REMOTE_STATIC, server_public)
        self.noise.start_handshake()
        self.send_cipher = None
        self.recv_cipher = None
        self.next_send = 1  # our record numbers start at 1 (§4, §7)
        self.recv_ack = 0  # highest record received in order from the server
        self.recv_pending = {}  # out-of-order records: seq -> plaintext
        self.stream_bytes = bytearray()  # decrypted stream bytes not yet framed into messages
        self.messages = []  # decoded JSON-RPC messages not yet consumed

    # -- handshake ----------------------------------------------------------------------------

    def open(self, token):
        """Send message 1 in an OPEN frame; return the frame's handshake payload (for replay)."""
        message1 = bytes(self.noise.write_message(handshake_payload(token)))
        self.link.send(encode_frame(OPEN, self.stream_id, message1, flags=SUITE))
        return message1

    def accept(self):
        """Wait for ACCEPT, verify message 2 and switch to transport mode."""
        frame = self.link.next_frame(self.stream_id)
        if frame.ftype == RESET:
            raise Failure(f"stream reset during the handshake: {frame.reset_reason()!r}")
        if frame.ftype != ACCEPT:
            raise Failure(f"expected ACCEPT, got {frame.name}")
        try:
            payload = bytes(self.noise.read_message(frame.payload))
        except Exception as e:  # noqa: BLE001 - the library raises several types
            raise Failure(f"handshake message 2 does not verify: {e!r}") from e
        if not self.noise.handshake_finished:
            raise Failure("handshake not finished after message 2")
        try:
            info = json.loads(payload.decode("utf-8"))
        except ValueError as e:
            raise Failure(f"message 2 payload is not UTF-8 JSON: {payload!r}") from e
        if not isinstance(info, dict) or info.get("version") != 1 \
                or not isinstance(info.get("serverVersion"), str):
            raise Failure(f"message 2 payload is not {{version: 1, serverVersion}}: {info!r}")
        proto = self.noise.noise_protocol
        self.send_cipher = ExplicitNonceCipher(proto.cipher_state_encrypt)
        self.recv_cipher = ExplicitNonceCipher(proto.cipher_state_decrypt)
        return info

    # -- records ------------------------------------------------------------------------------

    def ack_fields(self):
        """Cumulative ack plus selective ack bits (bit i = record ack + 2 + i, §5)."""
        bits = 0
        for seq in self.recv_pending:
            i = seq - self.recv_ack - 2
            if 0 <= i < 32:
                bits |= 1 << i
        return self.recv_ack, bits

    def send_record(self, kind, body):
        n = self.next_send
        self.next_send += 1
        ciphertext = self.send_cipher.encrypt(n, bytes([kind]) + body)
        ack, bits = self.ack_fields()
        self.link.send(encode_frame(DATA, self.stream_id, ciphertext, seq=n, ack=ack,
                                    ack_bits=bits))

    def send_message(self, message):
        """A JSON-RPC message on the stream: 4-byte big-endian length, then the JSON, cut into
        records of at most MAX_RECORD_PLAINTEXT bytes (§4)."""
        self.send_bytes(json.dumps(message, separators=(",", ":")).encode("utf-8"))

    def send_bytes(self, body):
        """One message of the stream (JSON text or a binary message), length-prefixed (§4)."""
        data = struct.pack("!I", len(body)) + body
        for off in range(0, len(data), MAX_RECORD_PLAINTEXT):
            self.send_record(KIND_STREAM, data[off:off + MAX_RECORD_PLAINTEXT])

    def close(self, reason="done"):
        """The authenticated close record (§4): ends the stream on purpose."""
        self.send_record(KIND_CLOSE, reason.encode("utf-8")[:256])

    def _receive_data(self, frame):
        seq = frame.seq
        if seq <= self.recv_ack or seq in self.recv_pending:
            return  # a retransmission of a record we already have: acknowledge again below
        if seq > self.recv_ack + WINDOW:
            raise Failure(f"DATA seq {seq} beyond our window (ack {self.recv_ack} + {WINDOW})")
        plaintext = self.recv_cipher.decrypt(seq, frame.payload)
        if not plaintext:
            raise Failure(f"record {seq} has no kind byte")
        self.recv_pending[seq] = plaintext
        # Hand records to the application in order.
        while self.recv_ack + 1 in self.recv_pending:
            self.recv_ack += 1
            record = self.recv_pending.pop(self.recv_ack)
            kind, body = record[0], record[1:]
            if kind == KIND_STREAM:
                self.stream_bytes += body
                self._split_messages()
            elif kind == KIND_CLOSE:
                raise Failure("server closed the stream: "
                              f"{body.decode('utf-8', 'replace')!r}")
            else:
                raise Failure(f"record {self.recv_ack} has unknown kind {kind}")

    def _split_messages(self):
        """Reassemble length-prefixed JSON-RPC messages across record boundaries."""
        while len(self.stream_bytes) >= 4:
            (length,) = struct.unpack_from("!I", self.stream_bytes)
            if length == 0 or length > MAX_MESSAGE_BYTES:
                raise Failure(f"server declared a message length of {length}")
            if len(self.stream_bytes) < 4 + length:
                return
            body = bytes(self.stream_bytes[4:4 + length])
            del self.stream_bytes[:4 + length]
            # §5.1: a JSON text starts with whitespace or a value; a first byte below 0x20
            # that is not whitespace (kind 0x00) starts a binary message.
            if body[0] < 0x20 and body[0] not in b"\t\n\r":
                self.messages.append(decode_binary_message(body))
                continue
            try:
                self.messages.append(json.loads(body.decode("utf-8")))
            except ValueError as e:
                raise Failure(f"server sent a message that is not JSON: {body[:200]!r}") from e

    def next_message(self):
        """The next JSON-RPC message from the server."""
        while not self.messages:
            frame = self.link.next_frame(self.stream_id)
            if frame.ftype == DATA:
                self._receive_data(frame)
                # Acknowledge at once, so the server neither retransmits nor stalls on its
                # window (§7: an ACK is sent alone when owed).
                ack, bits = self.ack_fields()
                self.link.send(encode_frame(ACK, self.stream_id, ack=ack, ack_bits=bits))
            elif frame.ftype == ACK:
                pass  # we keep no retransmission queue: the link is a single WebSocket
            elif frame.ftype == RESET:
                raise Failure(f"stream reset by the server: {frame.reset_reason()!r}")
            else:
                raise Failure(f"unexpected {frame.name} frame on an established stream")
        return self.messages.pop(0)


def decode_binary_message(body):
    """A binary output message (protocol.md §5.1), as the notification it stands for, with the
    raw chunk under `data` and `"binary": True`. Every field is checked against the layout."""
    if body[0] != KIND_OUTPUT_DELTA:
        raise Failure(f"binary message of reserved kind {body[0]}")
    if len(body) < BINARY_HEAD.size:
        raise Failure(f"binary message of {len(body)} bytes is shorter than its head")
    kind, stream, seq, id_len = BINARY_HEAD.unpack_from(body)
    if stream not in BINARY_STREAMS:
        raise Failure(f"binary message names unknown stream {stream}")
    if not 1 <= id_len <= MAX_PROCESS_ID_BYTES:
        raise Failure(f"binary message has a process id of {id_len} bytes")
    chunk_at = BINARY_HEAD.size + id_len
    if len(body) <= chunk_at:
        raise Failure("binary message has no chunk after its process id")
    chunk = body[chunk_at:]
    if len(chunk) > MAX_CHUNK_BYTES:
        raise Failure(f"binary message carries {len(chunk)} bytes, more than a chunk")
    try:
        process_id = body[BINARY_HEAD.size:chunk_at].decode("utf-8")
    except UnicodeDecodeError as e:
        raise Failure("binary message has a process id that is not UTF-8") from e
    return {"method": "process/outputDelta", "binary": True,
            "params": {"processId": process_id, "seq": seq,
                       "stream": BINARY_STREAMS[stream], "data": chunk}}


class ExplicitNonceCipher:
    """Transport encryption with explicit nonces (secure-transport.md §4).

    Record n of a direction is encrypted with Noise nonce n: ChaChaPoly with the 96-bit nonce
    `4 zero bytes || n as 8 bytes little-endian` and empty associated data, exactly the
    standard Noise ChaChaPoly encoding, but with n taken from the record number instead of
    an implicit counter (snow's stateless transport does the same).

    The `noiseprotocol` package has no stateless API, but its CipherState is the one of the
    Noise specification (§5.1), including SetNonce(): the nonce is set to n before every
    single encryption or decryption, so the library's own counter never matters and a
    failed decryption (which leaves the counter alone) cannot shift later nonces."""

    def __init__(self, cipher_state):
        if not cipher_state.has_key():
            raise Failure("transport cipher has no key after the handshake")
        self.cipher_state = cipher_state

    def encrypt(self, n, plaintext):
        self.cipher_state.set_nonce(n)
        return bytes(self.cipher_state.encrypt_with_ad(b"", plaintext))

    def decrypt(self, n, ciphertext):
        self.cipher_state.set_nonce(n)
        try:
            return bytes(self.cipher_state.decrypt_with_ad(b"", ciphertext))
        except Exception as e:  # noqa: BLE001 - cryptography's InvalidTag and friends
            raise Failure(f"record {n} does not decrypt with nonce {n}: {e!r}") from e


# ---------------------------------------------------------------------------------------------
# JSON-RPC over the stream (protocol.md §1, §3)
# ---------------------------------------------------------------------------------------------


class Rpc:
    def __init__(self, stream):
        self.stream = stream
        self.notifications = []

    def call(self, msg_id, method, params):
        self.stream.send_message({"jsonrpc": "2.0", "id": msg_id, "method": method,
                                  "params": params})
        while True:
            msg = self.stream.next_message()
            if "method" in msg:
                self.notifications.append(msg)
                continue
            if msg.get("id") != msg_id:
                raise Failure(f"response to an unknown request: {msg!r}")
            if "error" in msg:
                raise Failure(f"{method} failed: {msg['error']!r}")
            if "result" not in msg:
                raise Failure(f"{method}: response without result: {msg!r}")
            return msg["result"]

    def notify(self, method, params):
        self.stream.send_message({"jsonrpc": "2.0", "method": method, "params": params})

    def next_notification(self):
        if self.notifications:
            return self.notifications.pop(0)
        while True:
            msg = self.stream.next_message()
            if "method" in msg:
                return msg
            raise Failure(f"unexpected response: {msg!r}")


# protocol.md §5.2: a binary write. Integers big-endian: kind u8 (1), flags u8 (bit 0: close
# stdin after this chunk), request id u64, process id length u16 (1..256), writeId length u8
# (0: none), the process id, the writeId, then the raw stdin bytes.
WRITE_HEAD = struct.Struct("!BBQHB")
assert WRITE_HEAD.size == 13
KIND_WRITE = 1
FLAG_CLOSE_STDIN = 1


def encode_binary_write(msg_id, process_id, write_id, data, close_stdin=False, flags=None):
    pid = process_id.encode("utf-8")
    wid = write_id.encode("utf-8")
    if flags is None:
        flags = FLAG_CLOSE_STDIN if close_stdin else 0
    return WRITE_HEAD.pack(KIND_WRITE, flags, msg_id, len(pid), len(wid)) + pid + wid + data


def emit(line):
    print(line, flush=True)


def initialize(rpc, binary_output=False, binary_input=False):
    params = {"clientName": "py-interop", "capabilities": {}}
    if binary_output:
        params["capabilities"]["binaryOutput"] = True
    if binary_input:
        params["capabilities"]["binaryInput"] = True
    result = rpc.call(1, "initialize", params)
    emit("INITIALIZE_RESULT " + json.dumps(result, separators=(",", ":")))
    return result


def run_echo(rpc, binary_output=False):
    """`initialized`, then `echo interop-ok` (with binary output, also a line on stderr, under
    a process id that is not ASCII): print its output and exit code."""
    rpc.notify("initialized", {})
    if binary_output:
        process_id = "py-interop-ëcho"
        argv = ["sh", "-c", "echo interop-ok; echo interop-err >&2"]
    else:
        process_id = "py-interop-echo"
        argv = ["echo", "interop-ok"]
    started = rpc.call(2, "process/start", {"processId": process_id, "argv": argv})
    if started.get("processId") != process_id:
        raise Failure(f"process/start result: {started!r}")
    while True:
        note = rpc.next_notification()
        params = note.get("params") or {}
        if params.get("processId") != process_id:
            continue
        if note["method"] == "process/outputDelta":
            if note.get("binary"):
                chunk = params["data"]
            else:
                chunk = base64.b64decode(params["chunk"], validate=True)
            if binary_output:
                form = "binary" if note.get("binary") else "json"
                emit(f"FORM {form} {params.get('seq')} {params.get('stream')}")
            text = chunk.decode("utf-8", "replace")
            # One event per line: drop the trailing newline `echo` writes, escape any other.
            if text.endswith("\n"):
                text = text[:-1]
            label = "STDERR" if params.get("stream") == "stderr" else "OUTPUT"
            emit(f"{label} {text.replace(chr(10), chr(92) + 'n')}")
        elif note["method"] == "process/exited":
            code = params.get("exitCode")
            emit(f"EXITED {code}" if code is not None else f"EXITED signal {params.get('signal')}")
            return


def response_to(rpc, msg_id):
    """The response (result or error) with `msg_id`; notifications are kept."""
    while True:
        msg = rpc.stream.next_message()
        if "method" in msg:
            rpc.notifications.append(msg)
            continue
        if msg.get("id") == msg_id:
            return msg
        raise Failure(f"unexpected response while waiting for {msg_id}: {msg!r}")


def run_upload(rpc):
    """Binary writes (protocol.md §5.2) to `cat`: a write with a writeId, the same writeId
    again as JSON (not written twice), a malformed binary write (reserved flag: -32700, id
    null), then an empty write whose close flag ends cat's input. Prints every answer and what
    cat printed."""
    rpc.notify("initialized", {})
    pid = "py-ürload"
    rpc.call(2, "process/start", {"processId": pid, "argv": ["cat"], "pipeStdin": True})
    rpc.stream.send_bytes(encode_binary_write(3, pid, "w-1", b"interop-in\n"))
    emit(f"WRITE 3 {response_to(rpc, 3)['result']['status']}")
    chunk = base64.b64encode(b"DUPLICATE\n").decode("ascii")
    rpc.stream.send_message({"jsonrpc": "2.0", "id": 4, "method": "process/write",
                             "params": {"processId": pid, "writeId": "w-1", "chunk": chunk}})
    emit(f"WRITE 4 {response_to(rpc, 4)['result']['status']}")
    rpc.stream.send_bytes(encode_binary_write(5, pid, "", b"x", flags=0x02))
    bad = response_to(rpc, None)
    emit(f"MALFORMED {bad['error']['code']}")
    rpc.stream.send_bytes(encode_binary_write(6, pid, "w-2", b"", close_stdin=True))
    emit(f"WRITE 6 {response_to(rpc, 6)['result']['status']}")
    out = b""
    while True:
        note = rpc.next_notification()
        params = note.get("params") or {}
        if note["method"] == "process/outputDelta":
            out += base64.b64decode(params["chunk"], validate=True)
        elif note["method"] == "process/exited":
            emit("OUTPUT " + out.decode("utf-8", "replace").replace("\n", "|"))
            emit(f"EXITED {params.get('exitCode')}")
            return


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------


def mode_ok(link, client_private, server_public, token, binary_output=False,
            binary_input=False):
    stream = Stream(link, client_private, server_public)
    stream.open(token)
    stream.accept()
    rpc = Rpc(stream)
    result = initialize(rpc, binary_output, binary_input)
    if binary_input:
        if result.get("capabilities", {}).get("binaryInput") is not True:
            raise Failure(f"binaryInput not granted: {result!r}")
        run_upload(rpc)
    else:
        run_echo(rpc, binary_output)
    stream.close()
    return 0


def mode_replay(link, client_private, server_public, token):
    """Replay stream A's handshake message 1 in an OPEN on stream B of the same link.

    The prologue binds message 1 to its stream id (§3), so the server must fail to decrypt it
    on B and reset B (§8); it must never accept it. Stream A must carry on unaffected."""
    first = Stream(link, client_private, server_public)
    message1 = first.open(token)
    first.accept()  # a genuine handshake is accepted, so a reset below is the replay's doing

    other_id = os.urandom(16)
    while other_id == first.stream_id:
        other_id = os.urandom(16)
    link.send(encode_frame(OPEN, other_id, message1, flags=SUITE))
    while True:
        answer = link.next_frame(other_id)
        if answer.ftype in (ACCEPT, RESET):
            break
        if answer.ftype != ACK:
            raise Failure(f"unexpected {answer.name} frame on the replayed stream")
    emit(f"REPLAY_RESULT {answer.ftype}")

    # The established stream is unaffected by the failed handshake next to it (§8).
    initialize(Rpc(first))
    first.close()
    return 0 if answer.ftype == RESET else 1


def mode_replay_other_link(url, deadline, link, client_private, server_public, token):
    """Replay stream A's handshake message 1, with A's own stream id, on a second link.

    The prologue matches (same environment, same stream id), so the message decrypts; only
    its `ts`, not above the one the server accepted for this key, gets it refused (§3). The
    server must answer RESET, never ACCEPT; stream A carries on."""
    first = Stream(link, client_private, server_public)
    message1 = first.open(token)
    first.accept()
    second = Link(url, deadline)
    try:
        second.send(encode_frame(OPEN, first.stream_id, message1, flags=SUITE))
        while True:
            answer = second.next_frame(first.stream_id)
            if answer.ftype in (ACCEPT, RESET):
                break
            if answer.ftype != ACK:
                raise Failure(f"unexpected {answer.name} frame on the replayed stream")
    finally:
        second.close()
    reason = answer.reset_reason() if answer.ftype == RESET else "-"
    emit(f"REPLAY_RESULT {answer.ftype} {reason}")
    initialize(Rpc(first))
    first.close()
    return 0 if answer.ftype == RESET else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("url", help="noise+ws://HOST:PORT")
    parser.add_argument("server_pubkey_file", help="the server's NAME.pub")
    parser.add_argument("client_privkey_file", help="the client's private key file")
    parser.add_argument("--token", default=None)
    parser.add_argument("--ts-offset-seconds", type=float, default=0.0)
    parser.add_argument("--binary-output", action="store_true")
    parser.add_argument("--binary-input", action="store_true",
                        help="upload to cat with binary writes (protocol.md §5.2)")
    parser.add_argument("--suite", type=int, choices=sorted(NOISE_PROTOCOLS), default=0,
                        help="Noise suite: 0 ChaChaPoly, 1 AESGCM (secure-transport.md §3)")
    parser.add_argument("--mode", choices=["ok", "replay-on-other-stream",
                                           "replay-on-other-link"], default="ok")
    args = parser.parse_args(argv)
    global SUITE
    SUITE = args.suite
    HELLO_CLOCK.offset_us = int(args.ts_offset_seconds * 1_000_000)

    deadline = time.monotonic() + TIMEOUT_S
    link = None
    try:
        server_public = load_public_key(args.server_pubkey_file)
        client_private = load_private_key(args.client_privkey_file)
        link = Link(args.url, deadline)
        if args.mode == "ok":
            return mode_ok(link, client_private, server_public, args.token,
                           args.binary_output, args.binary_input)
        if args.mode == "replay-on-other-link":
            return mode_replay_other_link(args.url, deadline, link, client_private,
                                          server_public, args.token)
        return mode_replay(link, client_private, server_public, args.token)
    except Failure as e:
        emit(f"ERROR {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - anything unexpected is a failure too
        emit(f"ERROR unexpected {e!r}")
        return 2
    finally:
        if link is not None:
            link.close()


if __name__ == "__main__":
    sys.exit(main())
