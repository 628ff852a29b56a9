"""A write the server refuses for a full limit (-32004) is sent again, with the writes after
it: the server keeps a process's writes in order after a refusal
(``capabilities.retryRefusedWrites``), so the child gets every byte once, in order. With
``write_retry_for=0`` the refusal is raised. JSON writes fit the server's ``maxMessageBytes``.

The refusal is made, not hoped for: the server's byte budgets hold one large write, and the
child waits on a FIFO without reading its stdin, so the second write finds its pipe full and
holds its charge, and the third is refused. The test releases the child once the third write's
refusal has arrived."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Any, List

import pytest

from execrelay import RpcError, aio

#: Each byte budget of the server: one large write fits, two do not.
TIGHT = "90112"


@pytest.fixture
def tight_url(servers) -> str:
    return servers.ws("--max-message-bytes", TIGHT, "--max-pending-request-bytes", TIGHT,
                      "--max-inbound-bytes", TIGHT).url


def _fifo(tmp_path) -> str:
    path = str(tmp_path / "go")
    os.mkfifo(path)
    return path


async def _release(fifo: str) -> None:
    """Let the child blocked in ``read -r _ < FIFO`` go on (blocks until it has it open)."""
    def write() -> None:
        with open(fifo, "w") as f:
            f.write("go\n")
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, write), 30)


async def _recording(c: aio.Client) -> List["asyncio.Future[Any]"]:
    """The answers of every request sent on `c`'s connection from now on, in order."""
    conn = await c._conn_ready()
    sent: List["asyncio.Future[Any]"] = []
    start = conn._start

    async def record(msg, req_id):
        fut = await start(msg, req_id)
        sent.append(fut)
        return fut
    conn._start = record
    return sent


async def _third_refused(sent: List["asyncio.Future[Any]"]) -> None:
    """Wait for the third write's answer: the refusal (the first two are held by the child)."""
    deadline = time.monotonic() + 30
    while len(sent) < 3 or not sent[2].done():
        assert time.monotonic() < deadline, "the third write was not answered"
        await asyncio.sleep(0.01)
    kind, res = sent[2].result()
    assert kind == "error" and res["code"] == -32004, res


@pytest.mark.parametrize("binary", [True, False])
def test_a_refused_write_goes_again_and_every_byte_arrives_in_order(tight_url, tmp_path, binary):
    fifo = _fifo(tmp_path)

    async def main():
        async with await aio.connect(tight_url, binary=binary) as c:
            assert c.init_result["capabilities"]["retryRefusedWrites"] is True
            p = await c.start(["sh", "-c", 'read -r _ < "$0"; exec sha256sum', fifo], stdin=True)
            sent = await _recording(c)
            data = os.urandom(1_000_000)
            writing = asyncio.ensure_future(p._write(data, close=True))
            await _third_refused(sent)
            await _release(fifo)
            await asyncio.wait_for(writing, 60)
            assert c.writes_sent_again >= 1
            r = await p.wait(60)
            assert r.exit_code == 0
            assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    asyncio.run(main())


async def _hold_the_budget(c: aio.Client, fifo: str, sent: List["asyncio.Future[Any]"],
                           step: int) -> "tuple[Any, bytes, asyncio.Future[Any]]":
    """A process whose child reads nothing until `fifo` is released, holding the tight
    server's budget: its first write (of `step` bytes) fills its pipe, its second waits there
    with its charge. Returns it, its input and the task writing it (stdin closed after)."""
    holder = await c.start(["sh", "-c", 'read -r _ < "$0"; exec sha256sum', fifo], stdin=True)
    held = os.urandom(2 * step)
    first = len(sent)
    holding = asyncio.ensure_future(holder._write(held, close=True))
    deadline = time.monotonic() + 30
    while len(sent) < first + 2:
        assert time.monotonic() < deadline, "the holder's writes were not sent"
        await asyncio.sleep(0.01)
    # A round trip behind the holder's two writes: the server has read them both.
    await holder.signal("SIGCONT")
    return holder, held, holding


def _refusals(sent: List["asyncio.Future[Any]"], limits) -> int:
    """How many of the answers so far refuse a request for one of `limits`."""
    n = 0
    for fut in sent:
        if fut.done():
            kind, res = fut.result()
            data = res.get("data") if kind == "error" and isinstance(res, dict) else None
            if isinstance(data, dict) and data.get("limit") in limits:
                n += 1
    return n


@pytest.mark.parametrize("binary", [True, False])
def test_a_refused_write_goes_again_alone_and_the_rest_follow_it(tight_url, tmp_path, binary):
    """Another process, held on a FIFO, keeps the budget full (its first write fills its pipe,
    its second waits there with its charge). Five writes to a process that reads: the first is
    refused for the budget, the four behind it for the order. Tried three times while the
    budget stays full, the first goes alone: the four are refused once each."""
    fifo = _fifo(tmp_path)

    async def main():
        async with await aio.connect(tight_url, binary=binary) as c:
            # Both started first: with the budget full, a start would wait for it (tried again).
            up = await c.start(["sha256sum"], stdin=True)
            step = aio.BINARY_WRITE_CHUNK if binary else c._json_write_chunk()
            sent = await _recording(c)
            holder, held, holding = await _hold_the_budget(c, fifo, sent, step)
            data = os.urandom(5 * step)
            writing = asyncio.ensure_future(up._write(data, close=True))
            deadline = time.monotonic() + 30
            byte_limits = ("maxPendingRequestBytes", "maxInboundBytes")
            while _refusals(sent, byte_limits) < 3:
                assert time.monotonic() < deadline, "the first write was not refused three times"
                await asyncio.sleep(0.01)
            assert _refusals(sent, ("writeOrder",)) == 4
            await _release(fifo)
            await asyncio.wait_for(asyncio.gather(holding, writing), 60)
            assert c.writes_sent_again >= 2
            for proc, sent_bytes in ((up, data), (holder, held)):
                r = await proc.wait(60)
                assert r.exit_code == 0
                assert r.stdout.split()[0].decode() == hashlib.sha256(sent_bytes).hexdigest()
    asyncio.run(main())


def test_the_policy_counts_round_trips_and_starts_over_when_accepted():
    from execrelay._write_retry import WRITE_RETRY_MAX, WriteRetry

    def given_up_after(rtt: float) -> "tuple[int, float]":
        r, now, tries = WriteRetry(60.0), 1000.0, 0
        while True:
            pause = r.after_refusal(-32004, {"limit": "maxInboundBytes", "value": 1 << 20},
                                    65_000, True, now)
            if pause is None:
                return tries, now - 1000.0
            tries += 1
            now += pause + rtt
    near, near_took = given_up_after(0.0)
    far, far_took = given_up_after(0.2)
    assert 60.0 <= near_took < 60.0 + WRITE_RETRY_MAX
    assert 60.0 <= far_took < 60.0 + WRITE_RETRY_MAX + 0.2
    assert far < near, "each round trip counts against the limit"
    r = WriteRetry(60.0)
    assert r.after_refusal(-32004, None, 10, True, 0.0) == 0.005
    assert r.after_refusal(-32004, None, 10, True, 0.1) == 0.01
    r.accepted()
    assert r.after_refusal(-32004, None, 10, True, 500.0) == 0.005
    assert WriteRetry(0.0).after_refusal(-32004, None, 10, True, 0.0) is None
    assert r.after_refusal(-32004, None, 10, False, 500.0) is None, "no promise, no retry"
    assert r.after_refusal(-32602, None, 10, True, 500.0) is None, "not a limit"


def test_without_retries_the_refusal_is_raised(tight_url, tmp_path):
    fifo = _fifo(tmp_path)

    async def main():
        async with await aio.connect(tight_url, write_retry_for=0) as c:
            p = await c.start(["sh", "-c", 'read -r _ < "$0"; exec cat >/dev/null', fifo],
                              stdin=True)
            sent = await _recording(c)
            writing = asyncio.ensure_future(p.write(os.urandom(1_000_000)))
            await _third_refused(sent)
            await _release(fifo)
            with pytest.raises(RpcError) as e:
                await asyncio.wait_for(writing, 60)
            assert e.value.code == -32004
            assert e.value.data["limit"] == "maxPendingRequestBytes"
            assert c.writes_sent_again == 0
            await p.terminate()
    asyncio.run(main())


def test_the_blocking_client_takes_the_setting_and_counts(tight_url):
    import execrelay
    with execrelay.connect(tight_url, write_retry_for=2.5) as c:
        assert c._c._write_retry_for == 2.5
        assert c.writes_sent_again == 0
        assert c.run(["sh", "-c", "wc -c"], input=b"x" * 100_000).stdout.strip() == b"100000"


def test_a_start_refused_while_an_upload_fills_the_budget_goes_once_it_moves(tight_url, tmp_path):
    """A start refused for a limit that empties by itself (``maxPendingRequestBytes``, full of
    another process's held upload) is tried again, and goes once the upload moves; a start
    larger than ``maxMessageBytes`` is refused by the client, never sent (the server would
    close the connection, and the start, sent again on each new one, looped)."""
    from execrelay import RequestTooLarge
    from execrelay._write_retry import transient_limit
    fifo = _fifo(tmp_path)

    async def main():
        async with await aio.connect(tight_url) as c:
            step = aio.BINARY_WRITE_CHUNK
            sent = await _recording(c)
            holder, held, holding = await _hold_the_budget(c, fifo, sent, step)
            big = "x" * (int(TIGHT) - step)
            starting = asyncio.ensure_future(c.run(["sh", "-c", "echo started", big]))
            deadline = time.monotonic() + 30
            while _refusals(sent, ("maxPendingRequestBytes", "maxInboundBytes")) < 1:
                assert time.monotonic() < deadline, "the start was not refused"
                await asyncio.sleep(0.01)
            assert not starting.done(), "the start ended at its first refusal"
            await _release(fifo)
            r = await asyncio.wait_for(starting, 60)
            assert (r.stdout, r.exit_code) == (b"started\n", 0)
            await asyncio.wait_for(holding, 60)
            hr = await holder.wait(60)
            assert hr.stdout.split()[0].decode() == hashlib.sha256(held).hexdigest()

            resumes = c.resumes
            with pytest.raises(RequestTooLarge) as e:
                await asyncio.wait_for(c.run(["true", "x" * (int(TIGHT) + 1)]), 30)
            assert (e.value.method, e.value.limit) == ("process/start", int(TIGHT))
            assert "maxMessageBytes" in str(e.value)
            assert c.resumes == resumes, "the connection was kept"
            assert (await c.run(["echo", "fine"])).stdout == b"fine\n"
    asyncio.run(main())
    assert transient_limit(-32004, {"limit": "maxInboundBytes", "value": 1})
    assert not transient_limit(-32004, {"limit": "maxProcesses", "value": 1})
    assert not transient_limit(-32004, None)
    assert not transient_limit(-32602, {"limit": "maxInboundBytes"})
