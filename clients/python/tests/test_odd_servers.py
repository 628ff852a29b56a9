"""The package against servers that say odd things, or at odd moments (as the Rust library's
tests/client_odd_servers.rs): a fake server scripted per test makes each moment exact."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import execrelay
from execrelay import RpcError, aio

#: What the fake server does with one request: messages to send, or None to drop the
#: connection unanswered.
Script = Callable[[int, Dict[str, Any]], Optional[List[Dict[str, Any]]]]


def fake_server(script: Script, seen: List[Tuple[int, str]]):
    """A ws:// server that runs `script(conn, request)` on each request (conn 1 is the
    first connection) and records (conn, method) in `seen`."""
    from websockets.asyncio.server import serve

    conns = [0]

    async def handler(ws):
        conns[0] += 1
        conn = conns[0]
        async for raw in ws:
            m = json.loads(raw)
            if "method" not in m:
                continue
            seen.append((conn, m["method"]))
            out = script(conn, m)
            if out is None:
                return
            for msg in out:
                await ws.send(json.dumps(msg))
    return serve(handler, "127.0.0.1", 0)


def answer(m: Dict[str, Any], result: Any) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": m["id"], "result": result}


def initialized(conn: int, m: Dict[str, Any], max_message: Any) -> List[Dict[str, Any]]:
    return [answer(m, {
        "protocolVersion": 1, "serverVersion": "fake", "sessionId": "s", "resumeToken": "t",
        "resumed": conn > 1, "capabilities": {"acks": True, "retryRefusedWrites": True},
        "limits": {"maxMessageBytes": max_message, "detachedSessionTtlMs": 60000}})]


def refused(m: Dict[str, Any], limit: str = "maxPendingRequests", value: int = 1):
    return [{"jsonrpc": "2.0", "id": m["id"], "error": {
        "code": -32004, "message": "limit reached", "data": {"limit": limit, "value": value}}}]


def starts(seen: List[Tuple[int, str]]) -> List[int]:
    return [conn for conn, method in seen if method == "process/start"]


def url_of(server) -> str:
    return f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("limit", [0, False, -1, "16777216"])
def test_a_max_message_that_is_no_positive_integer_is_unknown(limit):
    """Not a positive integer: nothing refused locally, writes in full-size pieces (before,
    0, false or -1 refused every request with RequestTooLarge)."""
    pieces: List[int] = []

    def script(conn, m):
        method = m["method"]
        if method == "initialize":
            return initialized(conn, m, limit)
        if method == "process/start":
            return [answer(m, {"processId": m["params"]["processId"], "pid": 7})]
        if method == "process/write":
            pieces.append(len(base64.b64decode(m["params"]["chunk"])))
            return [answer(m, {"status": "accepted"})]
        return []

    async def main():
        async with fake_server(script, []) as server:
            c = await aio.connect(url_of(server))
            p = await c.start(["cat"], stdin=True, process_id="p")
            await asyncio.wait_for(p.write(b"x" * (2 * aio.JSON_WRITE_CHUNK + 5)), 30)
            assert pieces == [aio.JSON_WRITE_CHUNK, aio.JSON_WRITE_CHUNK, 5]
            await c.close(detach=True)
    asyncio.run(main())


@pytest.mark.parametrize("heard", [False, True])
def test_a_start_applied_on_a_lost_connection_is_not_started_twice_when_refused_after(heard):
    """Connection 1 takes the start and drops unanswered (it was carried out); connection 2
    refuses the start for a limit. Still listed, its pid is the answer; gone from the list but
    its output arrived, it ran and was forgotten: pid 0. Sent again, it would have run twice."""
    seen: List[Tuple[int, str]] = []
    listed = [] if heard else [{"processId": "p", "pid": 4242, "argv": ["true"],
                                "tty": False, "state": "exited", "nextSeq": 3, "exitCode": 0}]

    def script(conn, m):
        method = m["method"]
        if method == "initialize":
            out = initialized(conn, m, 1 << 24)
            if conn > 1 and heard:
                out.append({"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
                    "processId": "p", "seq": 1, "stream": "stdout", "chunk": "aGkK"}})
            return out
        if method == "process/start":
            return None if conn == 1 else refused(m)
        if method == "process/list":
            return [answer(m, {"processes": listed})]
        return []

    async def main():
        async with fake_server(script, seen) as server:
            c = await aio.connect(url_of(server))
            p = await asyncio.wait_for(c.start(["true"], process_id="p"), 30)
            assert p.pid == (0 if heard else 4242)
            assert starts(seen) == [1, 2]
            await c.close(detach=True)
    asyncio.run(main())


def test_a_start_of_many_short_arguments_that_can_never_fit_is_given_up_at_once():
    """2,000 one-letter arguments: 8 KB of text, but the server charges each value 128 bytes
    more, over a 64 KiB budget for good: reported at the first refusal, not tried for a
    minute."""
    seen: List[Tuple[int, str]] = []

    def script(conn, m):
        if m["method"] == "initialize":
            return initialized(conn, m, 1 << 24)
        if m["method"] == "process/start":
            return refused(m, "maxPendingRequestBytes", 65536)
        return []

    async def main():
        async with fake_server(script, seen) as server:
            c = await aio.connect(url_of(server))
            with pytest.raises(RpcError) as e:
                await asyncio.wait_for(c.start(["true"] + ["a"] * 2000, process_id="p"), 30)
            assert e.value.code == -32004
            assert starts(seen) == [1]
            await c.close(detach=True)
    asyncio.run(main())


def _lost_then_refused(list_refusals: int):
    """Connection 1 takes the start and drops unanswered; later connections refuse it, and
    refuse the first `list_refusals` lookups too, then list it running with pid 4242."""
    lists = [0]

    def script(conn, m):
        method = m["method"]
        if method == "initialize":
            return initialized(conn, m, 1 << 24)
        if method == "process/start":
            return None if conn == 1 else refused(m)
        if method == "process/list":
            lists[0] += 1
            if lists[0] <= list_refusals:
                return refused(m, "maxPendingControlRequests", 64)
            return [answer(m, {"processes": [{"processId": "p", "pid": 4242, "argv": ["true"],
                                              "tty": False, "state": "running",
                                              "nextSeq": 1}]})]
        return []
    return script


@pytest.mark.parametrize("retry_for,list_refusals", [(60.0, 1), (0.0, 0)])
def test_a_start_from_a_lost_connection_is_looked_up_before_it_goes_again_or_fails(
        retry_for, list_refusals):
    """A refused lookup says nothing: the start is not sent again until one answers. Without
    retries the refusal is raised, but not before the lookup: the process the lost attempt
    started is running, and that is the answer."""
    seen: List[Tuple[int, str]] = []

    async def main():
        async with fake_server(_lost_then_refused(list_refusals), seen) as server:
            c = await aio.connect(url_of(server), write_retry_for=retry_for)
            p = await asyncio.wait_for(c.start(["true"], process_id="p"), 30)
            assert p.pid == 4242
            assert starts(seen) == [1, 2]
            await c.close(detach=True)
    asyncio.run(main())


def test_a_read_answered_with_nothing_past_what_was_asked_fails_the_process():
    """Event 3 arrives first; the read after 0 is answered with event 0 only: asked again,
    the same answer, for ever. Once is enough: the gap is lost (`OutputLost`, 1 to 2)."""
    seen: List[Tuple[int, str]] = []

    def script(conn, m):
        method = m["method"]
        if method == "initialize":
            return initialized(conn, m, 1 << 24)
        if method == "process/start":
            return [answer(m, {"processId": "p", "pid": 9}),
                    {"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
                        "processId": "p", "seq": 3, "stream": "stdout", "chunk": "aGkK"}}]
        if method == "process/read":
            return [answer(m, {"events": [{"seq": m["params"]["afterSeq"], "type": "output",
                                           "stream": "stdout", "chunk": "aGkK"}],
                               "nextSeq": 4, "running": True, "exited": False})]
        return []

    async def main():
        async with fake_server(script, seen) as server:
            c = await aio.connect(url_of(server))
            p = await c.start(["true"], process_id="p")
            with pytest.raises(execrelay.OutputLost) as e:
                await asyncio.wait_for(p.wait(), 30)
            assert (e.value.from_seq, e.value.to_seq) == (1, 2)
            assert [m for _, m in seen].count("process/read") == 1
            await c.close(detach=True)
    asyncio.run(main())


def test_a_binary_write_larger_than_the_servers_messages_is_refused():
    """Binary writes are checked like JSON ones: a 64 KiB write against a server that reads
    16 KiB raises `RequestTooLarge` and is never sent (it would close the connection, and
    go again on each new one)."""
    seen: List[Tuple[int, str]] = []

    def script(conn, m):
        method = m["method"]
        if method == "initialize":
            out = initialized(conn, m, 16384)
            out[0]["result"]["capabilities"]["binaryInput"] = True
            return out
        if method == "process/start":
            return [answer(m, {"processId": "p", "pid": 9})]
        return []

    async def main():
        async with fake_server(script, seen) as server:
            c = await aio.connect(url_of(server))
            p = await c.start(["cat"], stdin=True, process_id="p")
            with pytest.raises(execrelay.RequestTooLarge) as e:
                await asyncio.wait_for(p.write(b"x" * 65536), 30)
            assert e.value.limit == 16384
            assert c.resumes == 0
            await c.close(detach=True)
    asyncio.run(main())
