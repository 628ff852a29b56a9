"""The asyncio API: the same names, 100 commands at once on one session."""

from __future__ import annotations

import asyncio

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
