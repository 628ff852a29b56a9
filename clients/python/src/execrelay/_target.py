"""Where the server is: URL forms, host aliases from the CLI's configuration file, and keys.

Owns: parsing the target forms of `execrelay run` (`ws://`, `noise+ws://`, `relay+ws://`,
`relay+wss://`) and host aliases (`[hosts.NAME]` in `$EXECRELAY_CONFIG`, else
`$XDG_CONFIG_HOME/execrelay/config.toml`, else `~/.config/execrelay/config.toml`; an argument
given to `connect` wins over the file), reading key files written by `execrelay keygen`.

Must never: log key material; guess a server key (there is no trust on first use).
"""

from __future__ import annotations

import base64
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .errors import ConfigError

KEY_TAG = "execrelay-x25519"
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_CONFIG_BYTES = 1 << 20
ENV_ID = re.compile(r"^[A-Za-z0-9._~-]{1,128}$")
#: The key used when neither `connect(key=...)` nor the host's entry names one.
DEFAULT_KEY = "~/.config/execrelay/id"


@dataclass
class Endpoint:
    """A resolved target: how to reach it and with which credentials."""

    kind: str  # "ws" | "noise"
    url: str  # the WebSocket URL actually dialled
    display: str  # what the user gave, for messages
    environment: str = ""
    server_key: Optional[bytes] = None
    private_key: Optional[bytes] = None
    token: Optional[str] = None
    ca_file: Optional[str] = None
    #: The host's `noise_suite` (0, 1, or None for auto), used when `connect` pins none.
    noise_suite: Optional[int] = None
    #: The host's `noise_window` (records), used when `connect` gives none.
    noise_window: Optional[int] = None


def config_path() -> str:
    """The client configuration file the CLI reads, by the same precedence."""
    explicit = os.environ.get("EXECRELAY_CONFIG")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return os.path.join(xdg, "execrelay", "config.toml")
    return os.path.expanduser("~/.config/execrelay/config.toml")


def _load_toml(path: str) -> Dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[import-not-found,no-redef]
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None


HOST_KEYS = ("url", "server_key", "key", "ca_file", "token_file", "noise_suite", "noise_window")
#: `noise_suite` of a host entry, as the CLI spells it.
SUITE_NAMES = {"auto": None, "chachapoly": 0, "aesgcm": 1}
#: The largest receive window a client advertises (the Rust client's MAX_CLIENT_WINDOW_RECORDS).
MAX_WINDOW = 256


def check_window(window: int, what: str = "noise_window") -> int:
    """`window` if it is a whole number of records in 1..256, else ValueError naming `what`."""
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"{what}: a stream window of {window!r} records is out of range: give 1 "
                         f"to {MAX_WINDOW} (records of at most 64 KiB)")
    return window


def host_entry(name: str) -> Optional[Dict[str, Any]]:
    """The `[hosts.NAME]` table of the configuration file, or None."""
    path = config_path()
    doc = _load_toml(path)
    hosts = doc.get("hosts", {})
    if not isinstance(hosts, dict):
        raise ConfigError(f"{path}: `hosts` must be a table of [hosts.NAME] tables")
    entry = hosts.get(name)
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: hosts.{name} must be a table")
    out: Dict[str, Any] = {}
    for k, v in entry.items():
        if k not in HOST_KEYS:
            raise ConfigError(f"{path}: hosts.{name}.{k}: unknown key (known: {', '.join(HOST_KEYS)})")
        if k == "noise_window":
            try:
                out[k] = check_window(v, f"{path}: hosts.{name}.noise_window")
            except ValueError as e:
                raise ConfigError(str(e)) from None
            continue
        if not isinstance(v, str):
            raise ConfigError(f"{path}: hosts.{name}.{k} must be a string")
        if k == "noise_suite":
            if v not in SUITE_NAMES:
                raise ConfigError(f"{path}: hosts.{name}.noise_suite: {v!r} is not auto, "
                                  "chachapoly or aesgcm")
            out[k] = SUITE_NAMES[v]
            continue
        out[k] = v
    if "url" not in out:
        raise ConfigError(f"{path}: hosts.{name} has no `url`")
    return out


def _b64_32(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ConfigError(f"{what}: not valid base64") from None
    if len(raw) != 32:
        raise ConfigError(f"{what}: a key must be 32 bytes, this one has {len(raw)}")
    return raw


def _read_small(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_KEY_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


def parse_public_line(line: str, what: str) -> bytes:
    """`execrelay-x25519 <base64> [comment]`, or a bare base64 key."""
    parts = line.split()
    if not parts:
        raise ConfigError(f"{what}: empty public key")
    b = parts[0]
    if b == KEY_TAG:
        if len(parts) < 2:
            raise ConfigError(f"{what}: missing key after {KEY_TAG}")
        b = parts[1]
    return _b64_32(b, what)


def load_server_key(arg: "str | bytes") -> bytes:
    """The pinned server key: raw 32 bytes, a `.pub` file, or the key line itself."""
    if isinstance(arg, (bytes, bytearray)):
        if len(arg) != 32:
            raise ConfigError("server_key: raw keys are 32 bytes")
        return bytes(arg)
    path = os.path.expanduser(arg)
    if os.path.exists(path):
        text, what = _read_small(path), path
    elif arg.strip().startswith(KEY_TAG) or "/" not in arg:
        text, what = arg, "server_key"
    else:
        raise ConfigError(f"server_key {arg}: no such file")
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            if line.strip().startswith(KEY_TAG) or len(line.split()) == 1:
                return parse_public_line(line, what)
            raise ConfigError(f"{what}: not a public key line (`{KEY_TAG} <base64> [comment]`)")
    raise ConfigError(f"{what}: no public key line")


def load_private_key(arg: "str | bytes") -> bytes:
    """The client's private key: raw 32 bytes or a file written by `execrelay keygen`."""
    if isinstance(arg, (bytes, bytearray)):
        if len(arg) != 32:
            raise ConfigError("key: raw keys are 32 bytes")
        return bytes(arg)
    path = os.path.expanduser(arg)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"key {path}: {e.strerror} (make one with `execrelay keygen -o {path}`)") from None
    text = _read_small(path)
    if text.strip().startswith(KEY_TAG):
        raise ConfigError(f"key {path}: this is a public key; give the private key (the file without .pub)")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"key {path}: readable by others (mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`")
    return _b64_32(text, f"key {path}")


def resolve(target: str, *, server_key: "str | bytes | None", key: "str | bytes | None",
            token: Optional[str], ca_file: Optional[str]) -> Endpoint:
    """Turn a URL or a host alias plus `connect`'s arguments into an Endpoint."""
    entry: Dict[str, Any] = {}
    display = target
    if "://" not in target:
        found = host_entry(target)
        if found is None:
            raise ConfigError(
                f"{target!r} is neither a URL (ws://, noise+ws://, relay+ws://, relay+wss://) nor a "
                f"host alias in {config_path()} (add a [hosts.{target}] table with its url)")
        entry = found
        target = entry["url"]
    server_key = server_key if server_key is not None else entry.get("server_key")
    key = key if key is not None else entry.get("key")
    ca_file = ca_file if ca_file is not None else entry.get("ca_file")
    if token is None and entry.get("token_file"):
        token = _read_small(os.path.expanduser(entry["token_file"])).strip()
    if ca_file is not None:
        ca_file = os.path.expanduser(ca_file)

    if target.startswith("ws://"):
        return Endpoint("ws", target, display)
    if target.startswith("noise+ws://"):
        hp = target[len("noise+ws://"):].rstrip("/")
        if not hp or "/" in hp:
            raise ConfigError(f"{target}: expected noise+ws://HOST:PORT")
        url, env = f"ws://{hp}/v1/link", ""
    elif target.startswith("relay+ws://") or target.startswith("relay+wss://"):
        scheme = "wss" if target.startswith("relay+wss://") else "ws"
        rest = target.split("://", 1)[1].rstrip("/")
        hp, _, env = rest.partition("/")
        if not hp or not env or not ENV_ID.match(env):
            raise ConfigError(f"{target}: expected relay+{scheme}://RELAY:PORT/ENVIRONMENT_ID "
                              "(an id is 1-128 of A-Z a-z 0-9 . _ - ~)")
        url = f"{scheme}://{hp}/v1/connect/{env}"
    else:
        raise ConfigError(f"{target}: unknown URL form (ws://, noise+ws://, relay+ws://, relay+wss://)")
    if server_key is None:
        raise ConfigError(f"{display}: a Noise target needs server_key= (the server's .pub file "
                          "or key line); there is no trust on first use")
    return Endpoint("noise", url, display, environment=env,
                    server_key=load_server_key(server_key),
                    private_key=load_private_key(key if key is not None else DEFAULT_KEY),
                    token=token, ca_file=ca_file, noise_suite=entry.get("noise_suite"),
                    noise_window=entry.get("noise_window"))
