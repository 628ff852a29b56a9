"""Nothing lost, nothing repeated: a resume under a cut link, checked by SHA-256."""

from __future__ import annotations

import hashlib

from conftest import connect_when_online

#: 200 MB of output, made on the server by a generator the test recomputes.
BIG = int(__import__("os").environ.get("BIG", 200 * 1000 * 1000))
CUT_EVERY = BIG * 9 // 40
GEN = ("python3 -c \"import sys,hashlib\n"
       "n={n}; b=hashlib.sha256(b'seed').digest()*2048\n"
       "w=sys.stdout.buffer\n"
       "while n>0:\n"
       "    k=min(n,len(b)); w.write(b[:k]); n-=k\n\"")


def expected_sha(n: int) -> str:
    b = hashlib.sha256(b"seed").digest() * 2048
    h = hashlib.sha256()
    while n > 0:
        k = min(n, len(b))
        h.update(b[:k])
        n -= k
    return h.hexdigest()


def test_resume_under_cut_link_200mb(target, make_proxy):
    proxy, url = make_proxy(target["url"])
    with connect_when_online(url, **target["kw"]) as c:
        h = hashlib.sha256()
        total = [0]

        def on_stdout(b: bytes) -> None:
            h.update(b)
            total[0] += len(b)

        # Cut the link three times while the output streams (the proxy counts every byte
        # towards the client, framing and replays included).
        proxy.cut_after_down(CUT_EVERY, times=3)
        r = c.start(GEN.format(n=BIG), on_stdout=on_stdout).wait()
        assert r.exit_code == 0, r
        assert proxy.cuts == 3, f"the proxy cut {proxy.cuts} times"
        assert c.resumes == 3, f"expected 3 resumes, saw {c.resumes}"
    assert total[0] == BIG
    assert h.hexdigest() == expected_sha(BIG)
