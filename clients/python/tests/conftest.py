"""Fixtures: real execrelay servers (conformance/servers.py) and the fault proxy.

The binaries come from `EXECRELAY_BIN` / `EXECRELAY_RELAY_BIN`, else this repository's
`target/release` or `target/debug` (`cargo build --release --bins` first).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterator

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "conformance"))

from fault_proxy import FaultProxy  # noqa: E402
from servers import Servers  # noqa: E402

import execrelay  # noqa: E402

#: The servers' keepalive in these tests: short, so a dead path is found in about a second.
KEEPALIVE = ("--keepalive-interval-ms", "300", "--pong-timeout-ms", "1000")


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    s = Servers()
    yield s
    s.close()


@pytest.fixture(scope="session")
def ws_url(servers: Servers) -> str:
    return servers.ws(*KEEPALIVE).url


@pytest.fixture(scope="session")
def noise_url(servers: Servers) -> str:
    return servers.noise(*KEEPALIVE).url


@pytest.fixture(scope="session")
def relay_url(servers: Servers) -> str:
    _relay, _env, url = servers.relay_pair(*KEEPALIVE)
    return url


@pytest.fixture(scope="session")
def creds(servers: Servers) -> dict:
    return {"server_key": servers.server_key + ".pub", "key": servers.client_key}


def connect_when_online(url: str, **kw) -> execrelay.Client:
    """Connect, waiting (hang guard 30 s) while a relay environment is still registering."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return execrelay.connect(url, **kw)
        except execrelay.ConnectError as e:
            if "offline" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(params=["ws", "noise", "relay"])
def target(request, ws_url: str, noise_url: str, relay_url: str, creds: dict) -> dict:
    """Every transport: the URL and the keyword arguments `connect` needs for it."""
    if request.param == "ws":
        return {"url": ws_url, "kw": {}}
    url = noise_url if request.param == "noise" else relay_url
    return {"url": url, "kw": dict(creds)}


@pytest.fixture
def client(target: dict) -> Iterator[execrelay.Client]:
    c = connect_when_online(target["url"], **target["kw"])
    yield c
    c.close()


def proxied(proxy: FaultProxy, url: str) -> str:
    """`url` with its host:port replaced by the proxy's (path and scheme kept)."""
    scheme, rest = url.split("://", 1)
    _hp, _, path = rest.partition("/")
    return f"{scheme}://127.0.0.1:{proxy.port}" + (f"/{path}" if path else "")


def upstream_of(url: str) -> tuple:
    hp = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = hp.rpartition(":")
    return host, int(port)


@pytest.fixture
def make_proxy() -> Iterator[Callable[[str], "tuple[FaultProxy, str]"]]:
    made = []

    def make(url: str) -> "tuple[FaultProxy, str]":
        p = FaultProxy(*upstream_of(url))
        made.append(p)
        return p, proxied(p, url)

    yield make
    for p in made:
        p.close()
