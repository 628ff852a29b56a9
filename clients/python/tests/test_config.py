"""Host aliases from the CLI's configuration file, with connect()'s arguments winning."""

from __future__ import annotations

import os

import pytest

import execrelay


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_alias_with_every_field(noise_url, servers, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("unused-token\n")
    server_line = open(servers.server_key + ".pub").read().strip()
    cfg = write_config(tmp_path, f"""
[hosts.box]
url = "{noise_url}"
server_key = "{server_line}"
key = "{servers.client_key}"
ca_file = "{tmp_path}/ca.pem"
token_file = "{token_file}"
""")
    monkeypatch.setenv("EXECRELAY_CONFIG", cfg)
    with execrelay.connect("box") as c:  # the server ignores a token it does not require
        assert c.run("echo via-alias").stdout == b"via-alias\n"
    # server_key as a path to the .pub file works too
    cfg = write_config(tmp_path, f"""
[hosts.box]
url = "{noise_url}"
server_key = "{servers.server_key}.pub"
key = "{servers.client_key}"
""")
    monkeypatch.setenv("EXECRELAY_CONFIG", cfg)
    with execrelay.connect("box") as c:
        assert c.run("echo pub-file").stdout == b"pub-file\n"


def test_argument_wins_over_file(noise_url, servers, tmp_path, monkeypatch):
    cfg = write_config(tmp_path, f"""
[hosts.box]
url = "{noise_url}"
server_key = "{servers.server_key}.pub"
key = "{servers.other_key}"
""")
    monkeypatch.setenv("EXECRELAY_CONFIG", cfg)
    with pytest.raises(execrelay.RefusedError):
        execrelay.connect("box")  # the file's key is not authorized
    with execrelay.connect("box", key=servers.client_key) as c:
        assert c.run("echo override").stdout == b"override\n"


def test_xdg_and_home_precedence(noise_url, servers, tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    (xdg / "execrelay").mkdir(parents=True)
    (xdg / "execrelay" / "config.toml").write_text(f"""
[hosts.xbox]
url = "{noise_url}"
server_key = "{servers.server_key}.pub"
key = "{servers.client_key}"
""")
    monkeypatch.delenv("EXECRELAY_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    with execrelay.connect("xbox") as c:
        assert c.run("echo xdg").stdout == b"xdg\n"
    home = tmp_path / "home"
    (home / ".config" / "execrelay").mkdir(parents=True)
    (home / ".config" / "execrelay" / "config.toml").write_text(f"""
[hosts.hbox]
url = "{noise_url}"
server_key = "{servers.server_key}.pub"
key = "{servers.client_key}"
""")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(home))
    with execrelay.connect("hbox") as c:
        assert c.run("echo home").stdout == b"home\n"


def test_default_key(noise_url, servers, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".config" / "execrelay").mkdir(parents=True)
    key = home / ".config" / "execrelay" / "id"
    key.write_bytes(open(servers.client_key, "rb").read())
    os.chmod(key, 0o600)
    monkeypatch.setenv("HOME", str(home))
    with execrelay.connect(noise_url, server_key=servers.server_key + ".pub") as c:
        assert c.run("echo default-key").stdout == b"default-key\n"


def test_broken_files_are_named(tmp_path, monkeypatch):
    cfg = write_config(tmp_path, "[hosts.box\nurl = 1\n")
    monkeypatch.setenv("EXECRELAY_CONFIG", cfg)
    with pytest.raises(execrelay.ConfigError, match="config.toml"):
        execrelay.connect("box")
    cfg = write_config(tmp_path, '[hosts.box]\nurl = "ws://127.0.0.1:1"\nkye = "x"\n')
    with pytest.raises(execrelay.ConfigError, match="hosts.box.kye: unknown key"):
        execrelay.connect("box")
    cfg = write_config(tmp_path, '[hosts.box]\nkey = "x"\n')
    with pytest.raises(execrelay.ConfigError, match="no `url`"):
        execrelay.connect("box")


def test_the_clis_noise_keys_are_read_and_checked(noise_url, servers, tmp_path, monkeypatch):
    """A host entry the CLI writes (`noise_suite`, `noise_window`) works here too: the suite
    is pinned, the window advertised; an argument wins; bad values are named."""
    entry = f"""
[hosts.box]
url = "{noise_url}"
server_key = "{servers.server_key}.pub"
key = "{servers.client_key}"
noise_suite = "chachapoly"
noise_window = 64
"""
    monkeypatch.setenv("EXECRELAY_CONFIG", write_config(tmp_path, entry))
    with execrelay.connect("box") as c:
        assert c.run("head -c 3000000 /dev/zero | wc -c").stdout == b"3000000\n"
        assert c.noise_suite == 0
        assert c._c._window == 64
    with execrelay.connect("box", noise_window=256, noise_suite=1) as c:
        assert c.run("echo arg").stdout == b"arg\n"
        assert (c.noise_suite, c._c._window) == (1, 256)
    for bad in (0, 257, True, '"many"'):
        monkeypatch.setenv("EXECRELAY_CONFIG", write_config(
            tmp_path, entry.replace("noise_window = 64", f"noise_window = {str(bad).lower()}")))
        with pytest.raises(execrelay.ConfigError, match="hosts.box.noise_window: a stream window of"):
            execrelay.connect("box")
    monkeypatch.setenv("EXECRELAY_CONFIG", write_config(
        tmp_path, entry.replace('"chachapoly"', '"fast"')))
    with pytest.raises(execrelay.ConfigError, match="hosts.box.noise_suite: 'fast' is not auto"):
        execrelay.connect("box")
    with pytest.raises(ValueError, match="noise_window: a stream window of 300 records"):
        execrelay.connect(noise_url, server_key=servers.server_key + ".pub",
                          key=servers.client_key, noise_window=300)
