#!/usr/bin/env python3
"""The Python package beside the Rust client and OpenSSH, all driven from Python, in one run.

Run by `benches/python_sdk.sh` (which builds the release binaries and the Rust adapter,
prepares a virtual environment with the package, and keeps a throwaway sshd up through
`benches/ssh_baseline.sh`). Measures, for each client:

- `run("true")` latency: p50 and p99 of BENCH_LATENCY_RUNS sequential runs on one warm
  connection (`/bin/sh -c true` everywhere: the Python package's `run("true")`, the Rust
  client through its conformance adapter (a long-lived process, JSON over a pipe), and ssh
  through a ControlMaster connection, one `ssh host true` subprocess per run);
- output throughput: BENCH_BYTES (default 1 GiB) of `head -c N /dev/zero`, counted by the
  client without keeping it (MB/s, 1 MB = 1e6 bytes).

The Python package is measured through its blocking API (`python_*`: callbacks on their own
thread) and its asyncio API (`python_aio_*`: callbacks on the loop); the ratios use the
blocking API.

The exec servers listen on ws:// (binary output) and noise+ws:// (ChaChaPoly: the server
has suite 0 only today); ssh uses its default cipher. Prints `KEY VALUE` lines and the
ratios Python / Rust and Python / ssh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "conformance"))

import execrelay  # noqa: E402
from servers import Servers  # noqa: E402

N_BYTES = int(os.environ.get("BENCH_BYTES", str(1 << 30)))
RUNS = int(os.environ.get("BENCH_LATENCY_RUNS", "300"))
RUST_ADAPTER = os.environ.get("RUST_ADAPTER", os.path.join(REPO, "target/release/examples/conformance-adapter"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, int(round(p / 100 * len(xs))) - 1))]


def out(key, value):
    print(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}", flush=True)


def python_client(name, url, kw):
    with execrelay.connect(url, **kw) as c:
        for _ in range(20):
            c.run("true")
        lat = []
        for _ in range(RUNS):
            t = time.perf_counter()
            c.run("true")
            lat.append((time.perf_counter() - t) * 1000)
        got = [0]

        def count(b):
            got[0] += len(b)
        t = time.perf_counter()
        r = c.start(f"head -c {N_BYTES} /dev/zero", on_stdout=count, capture=False).wait()
        secs = time.perf_counter() - t
        assert r.exit_code == 0 and got[0] == N_BYTES, (r, got[0])
    out(f"python_{name}_true_p50_ms", pct(lat, 50))
    out(f"python_{name}_true_p99_ms", pct(lat, 99))
    out(f"python_{name}_MBps", N_BYTES / secs / 1e6)
    return pct(lat, 50), N_BYTES / secs / 1e6


def python_aio(name, url, kw):
    """The asyncio API: callbacks run on the event loop (no thread hand-off per chunk)."""
    import asyncio
    from execrelay import aio

    async def main():
        async with await aio.connect(url, **kw) as c:
            for _ in range(20):
                await c.run("true")
            lat = []
            for _ in range(RUNS):
                t = time.perf_counter()
                await c.run("true")
                lat.append((time.perf_counter() - t) * 1000)
            got = [0]

            def count(b):
                got[0] += len(b)
            t = time.perf_counter()
            p = await c.start(f"head -c {N_BYTES} /dev/zero", on_stdout=count, capture=False)
            r = await p.wait()
            secs = time.perf_counter() - t
            assert r.exit_code == 0 and got[0] == N_BYTES, (r, got[0])
            return lat, secs
    lat, secs = asyncio.run(main())
    out(f"python_aio_{name}_true_p50_ms", pct(lat, 50))
    out(f"python_aio_{name}_MBps", N_BYTES / secs / 1e6)


class Rust:
    def __init__(self, env):
        full = dict(os.environ)
        full.update(env)
        self.p = subprocess.Popen([RUST_ADAPTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=full)
        self.n = 0

    def call(self, op, **kw):
        kw["op"] = op
        self.p.stdin.write((json.dumps(kw) + "\n").encode())
        self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())
        if not r.get("ok"):
            raise RuntimeError(f"{op}: {r}")
        return r

    def run(self, shell, **kw):
        self.n += 1
        pid = f"b{self.n}"
        self.call("start", id=pid, shell=shell, **kw)
        return self.call("wait", id=pid, timeout_ms=600000)

    def close(self):
        self.call("close")
        self.p.wait(10)


def rust_client(name, env):
    r = Rust(env)
    r.call("connect")
    for _ in range(20):
        r.run("true")
    lat = []
    for _ in range(RUNS):
        t = time.perf_counter()
        r.run("true")
        lat.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    res = r.run(f"head -c {N_BYTES} /dev/zero", count_only=True)
    secs = time.perf_counter() - t
    assert res["stdout_len"] == N_BYTES, res
    r.close()
    out(f"rust_{name}_true_p50_ms", pct(lat, 50))
    out(f"rust_{name}_true_p99_ms", pct(lat, 99))
    out(f"rust_{name}_MBps", N_BYTES / secs / 1e6)
    return pct(lat, 50), N_BYTES / secs / 1e6


def ssh_client():
    cfg = os.environ["SSH_BENCH_CONFIG"]
    cm = os.path.join(os.environ["SSH_BENCH_DIR"], "py-cm")
    base = ["ssh", "-F", cfg, "-o", f"ControlPath={cm}"]
    master = subprocess.Popen(base + ["-o", "ControlMaster=yes", "-N", "127.0.0.1"],
                              stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(cm):
            if time.monotonic() > deadline:
                raise RuntimeError("the ssh ControlMaster did not come up")
            time.sleep(0.05)
        for _ in range(20):
            subprocess.run(base + ["127.0.0.1", "true"], check=True, stdin=subprocess.DEVNULL)
        lat = []
        for _ in range(RUNS):
            t = time.perf_counter()
            subprocess.run(base + ["127.0.0.1", "true"], check=True, stdin=subprocess.DEVNULL)
            lat.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        p = subprocess.Popen(base + ["127.0.0.1", f"head -c {N_BYTES} /dev/zero"],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        got = 0
        while True:
            b = p.stdout.read1(1 << 20)
            if not b:
                break
            got += len(b)
        p.wait()
        secs = time.perf_counter() - t
        assert got == N_BYTES, got
    finally:
        subprocess.run(base + ["-O", "exit", "127.0.0.1"], capture_output=True)
        master.wait(10)
    out("ssh_true_p50_ms", pct(lat, 50))
    out("ssh_true_p99_ms", pct(lat, 99))
    out("ssh_MBps", N_BYTES / secs / 1e6)
    return pct(lat, 50), N_BYTES / secs / 1e6


def main():
    s = Servers()
    try:
        ws = s.ws().url
        noise = s.noise().url
        kw = {"server_key": s.server_key + ".pub", "key": s.client_key}
        print(f"# {N_BYTES} bytes per throughput run, {RUNS} latency runs", flush=True)
        py_ws = python_client("ws", ws, {})
        py_noise = python_client("noise", noise, kw)
        python_aio("ws", ws, {})
        python_aio("noise", noise, kw)
        rs_ws = rust_client("ws", {"EXECRELAY_TARGET": ws})
        rs_noise = rust_client("noise", {"EXECRELAY_TARGET": noise,
                                         "EXECRELAY_SERVER_KEY": s.server_key + ".pub",
                                         "EXECRELAY_KEY": s.client_key})
        ssh = ssh_client()
        for name, py, rs in (("ws", py_ws, rs_ws), ("noise", py_noise, rs_noise)):
            out(f"ratio_python_{name}_vs_rust_latency", py[0] / rs[0])
            out(f"ratio_python_{name}_vs_rust_MBps", py[1] / rs[1])
            out(f"ratio_python_{name}_vs_ssh_latency", py[0] / ssh[0])
            out(f"ratio_python_{name}_vs_ssh_MBps", py[1] / ssh[1])
        print("# latency ratio < 1: Python faster; MB/s ratio > 1: Python faster", flush=True)
    finally:
        s.close()


if __name__ == "__main__":
    main()
