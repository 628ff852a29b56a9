"""Typed errors of the execrelay client (every one a subclass of `ExecRelayError`)."""

from __future__ import annotations

from typing import Any, Optional


class ExecRelayError(Exception):
    """Base class of every error this package raises."""


class ConfigError(ExecRelayError, ValueError):
    """A target, key file or configuration file that cannot be used; the message says which."""


class ConnectError(ExecRelayError):
    """The server could not be reached (network, TLS, WebSocket, an offline environment)."""


class RefusedError(ConnectError):
    """The server (or relay) refused this client. Not retried.

    `what` says which credential was refused: ``"key"`` (the client key is not authorized),
    ``"token"`` (the token was refused), ``"server_key"`` (the pinned server key is not the
    server's: the handshake did not verify), ``"clock"`` (clock skew) or ``"other"``.
    """

    def __init__(self, message: str, what: str = "other", reason: str = "") -> None:
        super().__init__(message)
        self.what = what
        self.reason = reason


class ProtocolError(ExecRelayError):
    """The server sent something that breaks the protocol; the connection is not resumed."""


class SessionLost(ExecRelayError):
    """The session could not be resumed (its TTL passed, it expired, or the server forgot it)."""


class RequestTooLarge(ExecRelayError, ValueError):
    """A request larger than the server's ``maxMessageBytes`` (its ``initialize`` limits): not
    sent, as the server would close the connection on it. `method`, `size` and `limit` (bytes)
    say which and by how much."""

    def __init__(self, method: str, size: int, limit: int) -> None:
        super().__init__(
            f"a {method} request of {size} bytes is larger than the server's maxMessageBytes "
            f"({limit}): send less in one request (a shorter argv or env), or raise the "
            "server's limit")
        self.method = method
        self.size = size
        self.limit = limit


class RpcError(ExecRelayError):
    """The server answered a request with a JSON-RPC error (`code`, `message`, `data`)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class StartError(RpcError):
    """The process could not be started (`protocol.md` §2, `-32007`).

    `what` is ``"program"``, ``"cwd"``, ``"pty"`` or ``"other"``; `path` the path concerned;
    `errno` the error's name (``"ENOENT"``, ``"EACCES"``, ...). `exit_code` is what a shell
    would report: 127 for a program not found, 126 for one that cannot be executed, else None.
    """

    def __init__(self, code: int, message: str, data: Any = None, *, what: str = "other",
                 path: Optional[str] = None, errno: Optional[str] = None) -> None:
        super().__init__(code, message, data)
        self.what = what
        self.path = path
        self.errno = errno

    @property
    def exit_code(self) -> Optional[int]:
        """127 (not found) or 126 (cannot execute) for a program, as shells report them."""
        if self.what != "program":
            return None
        if self.errno == "ENOENT":
            return 127
        if self.errno in ("EACCES", "ENOEXEC", "EPERM", "EISDIR"):
            return 126
        return None


class NotApprovedError(RpcError):
    """The exec policy denied the process or its approval was refused/timed out (`-32006`)."""

    @property
    def reason(self) -> str:
        """Why (`data.reason`), e.g. ``denied by the exec policy``."""
        if isinstance(self.data, dict) and isinstance(self.data.get("reason"), str):
            return self.data["reason"]
        return self.message


class OutputLost(RpcError):
    """Events the server no longer retains were asked for (`-32005`); `from_seq..to_seq`."""

    @property
    def from_seq(self) -> Optional[int]:
        """The first event no longer retained."""
        return self.data.get("fromSeq") if isinstance(self.data, dict) else None

    @property
    def to_seq(self) -> Optional[int]:
        """The last event no longer retained."""
        return self.data.get("toSeq") if isinstance(self.data, dict) else None


class CommandError(ExecRelayError):
    """`Result.check()` on a command that did not exit with status 0."""

    def __init__(self, result: Any) -> None:
        self.result = result
        if result.signal:
            what = f"was killed by {result.signal}"
        else:
            what = f"exited with status {result.exit_code}"
        why = f" ({result.reason})" if result.reason and result.reason != "exited" else ""
        super().__init__(f"command {result.argv!r} {what}{why}")
