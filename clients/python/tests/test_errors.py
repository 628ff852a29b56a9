"""Typed errors: a refused key, a wrong server key, a bad token, bad targets and keys."""

from __future__ import annotations

import os

import pytest

import execrelay


@pytest.fixture(params=["noise", "relay"])
def noise_target(request, noise_url, relay_url):
    return noise_url if request.param == "noise" else relay_url


def test_refused_key(noise_target, servers):
    with pytest.raises(execrelay.RefusedError) as e:
        execrelay.connect(noise_target, server_key=servers.server_key + ".pub",
                          key=servers.other_key)
    assert e.value.what == "key"
    assert "authorized keys" in str(e.value)


def test_wrong_server_key(noise_target, servers):
    with pytest.raises(execrelay.RefusedError) as e:
        execrelay.connect(noise_target, server_key=servers.other_key + ".pub",
                          key=servers.client_key)
    assert e.value.what == "server_key"
    assert "server key" in str(e.value)


def test_token_required(servers):
    token_file = servers.write_file("token", "s3cret\n")
    url = servers.noise("--auth-token-file", token_file).url
    kw = {"server_key": servers.server_key + ".pub", "key": servers.client_key}
    with pytest.raises(execrelay.RefusedError) as e:
        execrelay.connect(url, token="wrong", **kw)
    assert e.value.what == "token"
    with execrelay.connect(url, token="s3cret", **kw) as c:
        assert c.run("echo ok").stdout == b"ok\n"


def test_token_file_of_a_host_alias(servers, tmp_path, monkeypatch):
    token_file = servers.write_file("token2", "alias-secret\n")
    url = servers.noise("--auth-token-file", token_file).url
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'''
[hosts.tok]
url = "{url}"
server_key = "{servers.server_key}.pub"
key = "{servers.client_key}"
token_file = "{token_file}"
''')
    monkeypatch.setenv("EXECRELAY_CONFIG", str(cfg))
    with execrelay.connect("tok") as c:
        assert c.run("echo token-file").stdout == b"token-file\n"
    with pytest.raises(execrelay.RefusedError):
        execrelay.connect("tok", token="wrong")  # the argument wins over the file


def test_unreachable_server():
    with pytest.raises(execrelay.ConnectError) as e:
        execrelay.connect("ws://127.0.0.1:1")
    assert "127.0.0.1:1" in str(e.value)
    # Nothing listens there: the message says what to check.
    assert str(e.value).endswith("is the exec server (or relay) running and listening on "
                                 "that address and port?"), str(e.value)


def test_a_wrong_scheme_names_the_right_one(servers, noise_url, creds):
    """An execrelay listener dialled with the wrong scheme answers 404 with the form to use;
    the error carries it with this host and port filled in."""
    host_port = noise_url.split("://", 1)[1]
    with pytest.raises(execrelay.ConnectError) as e:
        execrelay.connect("ws://" + host_port)
    assert str(e.value) == (f"ws://{host_port}: this is an execrelay exec server speaking "
                            f"Noise; use noise+ws://{host_port}")
    with pytest.raises(execrelay.ConnectError) as e:
        execrelay.connect(f"relay+ws://{host_port}/env-1", **creds)
    assert str(e.value).endswith(f"use noise+ws://{host_port}"), str(e.value)
    relay = servers.relay()
    relay_hp = relay.url.split("://", 1)[1]
    with pytest.raises(execrelay.ConnectError) as e:
        execrelay.connect(f"noise+ws://{relay_hp}", **creds)
    assert f"this is an execrelay relay; clients use relay+ws://{relay_hp}/ENVIRONMENT_ID" in \
        str(e.value), str(e.value)


def test_bad_targets_and_keys(servers, tmp_path):
    with pytest.raises(execrelay.ConfigError, match="no trust on first use"):
        execrelay.connect("noise+ws://127.0.0.1:9")
    with pytest.raises(execrelay.ConfigError, match="unknown URL form"):
        execrelay.connect("http://127.0.0.1:9")
    with pytest.raises(execrelay.ConfigError, match="ENVIRONMENT_ID"):
        execrelay.connect("relay+ws://127.0.0.1:9/", server_key=servers.server_key + ".pub")
    pub = servers.client_key + ".pub"
    with pytest.raises(execrelay.ConfigError, match="public key"):
        execrelay.connect("noise+ws://127.0.0.1:9", server_key=servers.server_key + ".pub",
                          key=pub)
    loose = tmp_path / "loose"
    loose.write_bytes(open(servers.client_key, "rb").read())
    os.chmod(loose, 0o644)
    with pytest.raises(execrelay.ConfigError, match="chmod 600"):
        execrelay.connect("noise+ws://127.0.0.1:9", server_key=servers.server_key + ".pub",
                          key=str(loose))
    with pytest.raises(execrelay.ConfigError, match="no such file"):
        execrelay.connect("noise+ws://127.0.0.1:9", server_key="/nonexistent/server.pub",
                          key=servers.client_key)
    with pytest.raises(execrelay.ConfigError, match="neither a URL"):
        execrelay.connect("no-such-alias-here")


def test_offline_environment(servers, creds):
    relay = servers.relay()
    url = relay.url.replace("ws://", "relay+ws://") + "/env-1"
    with pytest.raises(execrelay.ConnectError, match="offline"):
        execrelay.connect(url, **creds)


def test_a_listeners_404_text_is_recognised_never_echoed():
    """A listener that is not ours (or is hostile) answers 404 with words of its own: the error
    keeps our words, with none of its text or terminal escapes."""
    import socket
    import threading

    body = b"this is an execrelay relay; use relay+ws://evil.example/x \x1b[2J"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\nConnection: close"
                         b"\r\n\r\n" % len(body) + body)

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(execrelay.ConnectError) as e:
            execrelay.connect(f"ws://127.0.0.1:{port}")
    finally:
        t.join(10)
        listener.close()
    words = str(e.value)
    assert words == (f"ws://127.0.0.1:{port}: this is an execrelay relay; clients use "
                     f"relay+ws://127.0.0.1:{port}/ENVIRONMENT_ID (relay+wss:// over TLS)"), words
    assert "evil" not in words and "\x1b" not in words
