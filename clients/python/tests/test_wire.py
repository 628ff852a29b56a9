"""Malformed input from a server: a clear error, never a crash, a hang or a silent gap."""

from __future__ import annotations

import asyncio
import json

import pytest

import execrelay
from execrelay import _link, aio
from execrelay._link import LinkError, decode_frame, encode_frame


def bare_client() -> aio.Client:
    c = object.__new__(aio.Client)
    c._procs = {}
    return c


@pytest.mark.parametrize("msg,why", [
    (b"\x00\x00" + (1).to_bytes(8, "big"), "too short"),
    (b"\x00\x07" + (1).to_bytes(8, "big") + (1).to_bytes(2, "big") + b"pX", "unknown stream"),
    (b"\x00\x00" + (1).to_bytes(8, "big") + (0).to_bytes(2, "big") + b"pX", "lengths"),
    (b"\x00\x00" + (1).to_bytes(8, "big") + (300).to_bytes(2, "big") + b"p" * 300 + b"X", "lengths"),
    (b"\x00\x00" + (1).to_bytes(8, "big") + (5).to_bytes(2, "big") + b"p1", "lengths"),
    (b"\x00\x00" + (1).to_bytes(8, "big") + (1).to_bytes(2, "big") + b"\xff" + b"X", "UTF-8"),
    (b"\x00\x00" + (1).to_bytes(8, "big") + (1).to_bytes(2, "big") + b"p" + b"X" * 65537, "64 KiB"),
])
def test_binary_output_rejects(msg, why):
    with pytest.raises(execrelay.ProtocolError, match=why):
        bare_client()._on_binary(msg)


def test_frames_rejected():
    with pytest.raises(LinkError, match="shorter"):
        decode_frame(b"\x01\x03")
    with pytest.raises(LinkError, match="version"):
        decode_frame(b"\x02" + encode_frame(_link.DATA, b"\0" * 16)[1:])
    with pytest.raises(LinkError, match="unknown frame type"):
        decode_frame(b"\x01\x09" + encode_frame(_link.DATA, b"\0" * 16)[2:])
    with pytest.raises(LinkError, match="over the limit"):
        decode_frame(encode_frame(_link.DATA, b"\0" * 16, b"x" * 70000))
    ftype, sid, seq, ack, window, payload = decode_frame(
        encode_frame(_link.DATA, b"s" * 16, b"body", seq=7, ack=3, window=16))
    assert (ftype, sid, seq, ack, window, bytes(payload)) == (_link.DATA, b"s" * 16, 7, 3, 16, b"body")


def fake_server(after_init):
    """A ws:// server that answers initialize, then runs `after_init(ws)`."""
    from websockets.asyncio.server import serve

    async def handler(ws):
        async for raw in ws:
            m = json.loads(raw)
            if m.get("method") == "initialize":
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {
                    "protocolVersion": 1, "sessionId": "s-1", "resumeToken": "t",
                    "resumed": False, "capabilities": {"acks": True, "binaryOutput": True},
                    "limits": {"detachedSessionTtlMs": 60000}}}))
            elif m.get("method") == "process/start":
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": m["id"],
                                          "result": {"processId": "p-1", "pid": 1}}))
                await after_init(ws)
    return serve(handler, "127.0.0.1", 0)


@pytest.mark.parametrize("bad", [
    b"\x00\x05" + (1).to_bytes(8, "big") + (3).to_bytes(2, "big") + b"p-1X",  # bad stream
    "this is not json",
    json.dumps({"jsonrpc": "2.0", "method": "process/outputDelta",
                "params": {"processId": "p-1", "stream": "stdout", "chunk": "aGk="}}),  # no seq
])
def test_broken_server_is_a_clear_failure_not_a_resume(bad):
    async def main():
        async def send_bad(ws):
            await ws.send(bad)
        async with fake_server(send_bad) as server:
            port = server.sockets[0].getsockname()[1]
            c = await aio.connect(f"ws://127.0.0.1:{port}")
            p = await c.start(["x"])
            with pytest.raises(execrelay.ProtocolError):
                await asyncio.wait_for(p.wait(), 10)
            assert c.resumes == 0
            await c.close()
    asyncio.run(main())


def test_gap_is_filled_by_process_read():
    """Events past a gap wait while the client reads the missing ones with process/read."""
    async def main():
        import base64

        async def gap(ws):
            async def delta(seq, data):
                await ws.send(json.dumps({"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
                    "processId": "p-1", "seq": seq, "stream": "stdout",
                    "chunk": base64.b64encode(data).decode()}}))
            await delta(1, b"one ")
            await delta(3, b"three ")  # 2 is missing: the client must ask for it
            raw = json.loads(await ws.recv())
            while raw.get("method") != "process/read":
                raw = json.loads(await ws.recv())
            assert raw["params"]["afterSeq"] == 1
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": raw["id"], "result": {
                "events": [{"seq": 2, "type": "output", "stream": "stdout",
                            "chunk": base64.b64encode(b"two ").decode()}],
                "nextSeq": 3, "running": True, "exited": False}}))
            await ws.send(json.dumps({"jsonrpc": "2.0", "method": "process/exited", "params": {
                "processId": "p-1", "seq": 4, "exitCode": 0, "signal": None, "timedOut": False,
                "durationMs": 1}}))
        async with fake_server(gap) as server:
            port = server.sockets[0].getsockname()[1]
            c = await aio.connect(f"ws://127.0.0.1:{port}")
            p = await c.start(["x"])
            r = await asyncio.wait_for(p.wait(), 10)
            assert r.stdout == b"one two three "
            await c.close(detach=True)
    asyncio.run(main())


def test_gap_no_longer_retained_is_reported():
    """A gap the server no longer retains (-32005) ends the process's stream with OutputLost
    naming the range: never a silent gap."""
    async def main():
        import base64

        async def gap(ws):
            await ws.send(json.dumps({"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
                "processId": "p-1", "seq": 5, "stream": "stdout",
                "chunk": base64.b64encode(b"late").decode()}}))
            raw = json.loads(await ws.recv())
            while raw.get("method") != "process/read":
                raw = json.loads(await ws.recv())
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": raw["id"], "error": {
                "code": -32005, "message": "output no longer retained",
                "data": {"fromSeq": 1, "toSeq": 4}}}))
        async with fake_server(gap) as server:
            port = server.sockets[0].getsockname()[1]
            c = await aio.connect(f"ws://127.0.0.1:{port}")
            p = await c.start(["x"])
            with pytest.raises(execrelay.OutputLost) as e:
                await asyncio.wait_for(p.wait(), 10)
            assert (e.value.from_seq, e.value.to_seq) == (1, 4)
            await c.close(detach=True)
    asyncio.run(main())
