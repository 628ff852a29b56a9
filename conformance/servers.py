"""Real execrelay servers for the conformance kit and the Python package's tests.

Standard library only. Finds the built binaries (`EXECRELAY_BIN`, `EXECRELAY_RELAY_BIN`, else
`target/release` then `target/debug` of this repository), makes keys with `execrelay keygen`,
and starts:

- a plain `ws://` exec server,
- a `noise+ws://` exec server (its key, an authorized client key),
- a relay and an exec server registered with it (`relay+ws://…/ENV`),

each with the extra flags a scenario needs (a short keepalive, an exec policy, a short TTL),
reading the bound URL from the first line of stdout. Every process is stopped by `close()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Hang guard for a server to print its URL (a debug build on a loaded machine is slow).
START_TIMEOUT = 60.0


class ServerError(Exception):
    """A server could not be found or started; the message says what to do."""


def find_binary(name: str, env: str) -> str:
    explicit = os.environ.get(env)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ServerError(f"{env}={explicit} is not an executable")
        return explicit
    for profile in ("release", "debug"):
        path = os.path.join(REPO, "target", profile, name)
        if os.access(path, os.X_OK):
            return path
    raise ServerError(
        f"cannot find the {name} binary: build it (`cargo build --release --bins` in {REPO}) "
        f"or set {env} to its path")


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that spawned it ends (Linux
    PR_SET_PDEATHSIG), so servers never outlive a harness that was killed."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: The parent-death signal follows the spawning *thread*: every server is spawned from this
#: one worker thread, which lives as long as the harness.
_SPAWNER = None


def _spawn(argv: List[str], **kw) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    global _SPAWNER
    from concurrent.futures import ThreadPoolExecutor

    if _SPAWNER is None:
        _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-spawner")
    return _SPAWNER.submit(lambda: subprocess.Popen(argv, preexec_fn=_die_with_parent, **kw)).result()


class Proc:
    """A started server process: its URL (first stdout line) and its stderr log."""

    def __init__(self, argv: List[str], log_path: str, env: Optional[Dict[str, str]] = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")
        full_env = dict(os.environ)
        full_env.setdefault("RUST_LOG", "info")
        if env:
            full_env.update(env)
        self.p = _spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=self._log, env=full_env, start_new_session=True)
        self.url = self._first_line()
        # Keep draining stdout so the server never blocks on it.
        threading.Thread(target=self._drain, daemon=True).start()

    def _first_line(self) -> str:
        assert self.p.stdout is not None
        result: List[str] = []

        def read() -> None:
            assert self.p.stdout is not None
            result.append(self.p.stdout.readline().decode("utf-8", "replace").strip())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(START_TIMEOUT)
        if not result or not result[0]:
            self.stop()
            raise ServerError(f"{' '.join(self.argv)} printed no URL within {START_TIMEOUT:g} s; "
                              f"its log:\n{self.log()[-4000:]}")
        return result[0]

    def _drain(self) -> None:
        assert self.p.stdout is not None
        try:
            while self.p.stdout.read(65536):
                pass
        except (OSError, ValueError):
            pass

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> Optional[int]:
        if self.p.poll() is None:
            try:
                self.p.send_signal(sig)
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._log.close()
        return self.p.returncode

    def kill(self) -> None:
        """SIGKILL (a crash): no shutdown sequence."""
        self.stop(signal.SIGKILL)


class Servers:
    """A scratch directory of keys and the servers started in it."""

    def __init__(self, workdir: Optional[str] = None) -> None:
        self.bin = find_binary("execrelay", "EXECRELAY_BIN")
        self._relay_bin: Optional[str] = None
        self.dir = workdir or tempfile.mkdtemp(prefix="execrelay-servers-")
        os.makedirs(self.dir, exist_ok=True)
        self._own_dir = workdir is None
        self.procs: List[Proc] = []
        self.server_key = self.keygen("server")
        self.client_key = self.keygen("client")
        self.other_key = self.keygen("stranger")  # never authorized
        self.authorized = os.path.join(self.dir, "authorized_keys")
        with open(self.authorized, "w") as f:
            with open(self.client_key + ".pub") as pub:
                f.write(pub.read())
        self._counter = 0

    @property
    def relay_bin(self) -> str:
        if self._relay_bin is None:
            self._relay_bin = find_binary("execrelay-relay", "EXECRELAY_RELAY_BIN")
        return self._relay_bin

    def keygen(self, name: str) -> str:
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            out = subprocess.run([self.bin, "keygen", "-o", path], capture_output=True, timeout=60)
            if out.returncode != 0:
                raise ServerError(f"execrelay keygen failed: {out.stderr.decode(errors='replace')}")
        return path

    def _log(self, what: str) -> str:
        self._counter += 1
        return os.path.join(self.dir, f"{self._counter:02d}-{what}.log")

    def write_file(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start(self, argv: List[str], what: str) -> Proc:
        p = Proc(argv, self._log(what))
        self.procs.append(p)
        return p

    def ws(self, *extra: str) -> Proc:
        """`execrelay serve --listen ws://127.0.0.1:0 EXTRA…`."""
        return self.start([self.bin, "serve", "--listen", "ws://127.0.0.1:0", *extra], "ws")

    def noise(self, *extra: str) -> Proc:
        """`execrelay serve --listen noise+ws://127.0.0.1:0 --key … --authorized-keys … EXTRA…`."""
        return self.start([self.bin, "serve", "--listen", "noise+ws://127.0.0.1:0",
                           "--key", self.server_key, "--authorized-keys", self.authorized,
                           *extra], "noise")

    def relay(self, *extra: str) -> Proc:
        """A relay whose environments file lists `env-1` with the server's key."""
        relay_key = self.keygen("relay")
        with open(self.server_key + ".pub") as pub:
            envs = self.write_file("environments", "env-1 " + pub.read())
        return self.start([self.relay_bin, "--listen", "ws://127.0.0.1:0", "--key", relay_key,
                           "--environments", envs, *extra], "relay")

    def environment(self, relay_url: str, *extra: str, env_id: str = "env-1") -> Proc:
        """An exec server registered with the relay at `relay_url` under `env_id`."""
        return self.start([self.bin, "serve", "--relay", relay_url, "--environment-id", env_id,
                           "--relay-key", os.path.join(self.dir, "relay.pub"),
                           "--key", self.server_key, "--authorized-keys", self.authorized,
                           *extra], "environment")

    def relay_pair(self, *extra: str) -> "tuple[Proc, Proc, str]":
        """A relay, an exec server registered with it, and the client URL once it is online."""
        relay = self.relay()
        env = self.environment(relay.url, *extra)
        url = env.url  # relay+ws://…/env-1
        return relay, env, url

    def close(self) -> None:
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception:  # noqa: BLE001
                pass
        self.procs.clear()
        if self._own_dir and not os.environ.get("EXECRELAY_KEEP_SCRATCH"):
            shutil.rmtree(self.dir, ignore_errors=True)


def wait_ready(http_url: str, timeout: float = 30.0) -> None:
    """Poll `GET /readyz` until 200 (hang guard `timeout`)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(http_url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = str(e)
        time.sleep(0.05)
    raise ServerError(f"{http_url}/readyz not ready within {timeout:g} s: {last}")
