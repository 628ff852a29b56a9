"""The asyncio API: the same names, 100 commands at once on one session."""

from __future__ import annotations

import asyncio
import hashlib
import os

from execrelay import ConnectError, aio


async def _connect(target):
    import time
    deadline = time.monotonic() + 30
    while True:
        try:
            return await aio.connect(target["url"], **target["kw"])
        except ConnectError as e:
            if "offline" not in str(e) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_hundred_commands_at_once(target):
    async def main():
        async with await _connect(target) as c:
            rs = await asyncio.gather(*(c.run(f"echo {i}; echo e{i} >&2; exit {i % 7}")
                                        for i in range(100)))
            for i, r in enumerate(rs):
                assert r.stdout == f"{i}\n".encode()
                assert r.stderr == f"e{i}\n".encode()
                assert r.exit_code == i % 7
            # And 100 running at the same time, each waiting for its stdin.
            ps = await asyncio.gather(*(c.start(["cat"], stdin=True) for _ in range(100)))
            assert len({p.pid for p in ps}) == 100
            await asyncio.gather(*(p._write(f"in{i}".encode(), close=True)
                                   for i, p in enumerate(ps)))
            res = await asyncio.gather(*(p.wait(60) for p in ps))
            assert [r.stdout for r in res] == [f"in{i}".encode() for i in range(100)]
    asyncio.run(main())


def test_async_events_and_callbacks(target):
    async def main():
        async with await _connect(target) as c:
            got = []

            async def on_err(b):
                got.append(b)
            p = await c.start("echo a; echo b >&2; echo c", on_stderr=on_err)
            kinds = [ev.kind async for ev in p.events()]
            assert kinds[-1] == "exit" and "stdout" in kinds
            res = await p.wait()
            assert res.stdout == b"a\nc\n"
            await asyncio.sleep(0)
            assert got == [b"b\n"]
            p = await c.start(["cat"], stdin=True)
            await p.write(b"x" * 100)
            await p.close_stdin()
            assert (await p.wait()).stdout == b"x" * 100
    asyncio.run(main())


def test_a_large_write_keeps_its_chunks_in_flight(target, tmp_path):
    """One write() of 8 MB does not wait for each chunk's answer: the child reads nothing
    until the test sees `aio.BINARY_WRITES_IN_FLIGHT` chunks in flight at once (so a far
    server is not held to one round trip per chunk), then every byte arrives in order."""
    go = tmp_path / "go"

    async def main():
        async with await _connect(target) as c:
            conn = await c._conn_ready()
            depth = aio.BINARY_WRITES_IN_FLIGHT if c._binary_input else aio.JSON_WRITES_IN_FLIGHT
            peak = [0]
            start = conn._start

            async def counting(msg, req_id):
                fut = await start(msg, req_id)
                peak[0] = max(peak[0], len(conn.pending))
                if peak[0] >= depth:
                    go.touch()
                return fut
            conn._start = counting
            data = os.urandom(8_000_000)
            p = await c.start(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.01; done; "
                               "exec sha256sum"], stdin=True)
            # Unpipelined, the child never reads and this hangs: the guard fails it instead.
            await asyncio.wait_for(p._write(data, close=True), 60)
            r = await p.wait(60)
            assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
            assert peak[0] == depth, f"at most {depth} in flight, and that many: {peak[0]}"
    asyncio.run(main())
