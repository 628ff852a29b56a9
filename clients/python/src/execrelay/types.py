"""Values the client hands to the application: results, events, approval requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import CommandError


@dataclass
class Result:
    """How a process ended, and its output when it was captured.

    `exit_code` (None when killed by a signal), `signal` (e.g. ``"SIGKILL"``), `reason`
    (``exited``, ``timeout``, ``terminated``, ``sessionClosed``, ``sessionExpired``,
    ``serverShutdown``, ``oomKilled``: `protocol.md` §5), `stdout` and `stderr` (bytes; a PTY's
    output is in `stdout`), `duration` (seconds, measured by the server).
    """

    argv: List[str]
    exit_code: Optional[int]
    signal: Optional[str]
    reason: str
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    timed_out: bool = False
    output_drain_timed_out: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    dropped_bytes: int = 0
    #: (stream, omitted bytes) for each `process/outputOmitted` (`keep_tail=True`).
    omitted: List[Tuple[str, int]] = field(default_factory=list)
    #: True when the server sent `reason` itself (older servers do not: it is then inferred).
    reason_from_server: bool = True

    @property
    def ok(self) -> bool:
        """True when the process exited with status 0."""
        return self.exit_code == 0 and self.signal is None

    def check(self) -> "Result":
        """Raise `CommandError` unless the status is 0; return self otherwise."""
        if not self.ok:
            raise CommandError(self)
        return self


@dataclass
class Event:
    """One event of a process, in `seq` order.

    `kind` is ``"stdout"``, ``"stderr"``, ``"pty"`` (with `data`), ``"omitted"`` (with `stream`
    and `omitted_bytes`: output a `keep_tail` cap left out) or ``"exit"`` (with `result`).
    """

    kind: str
    seq: int
    data: bytes = b""
    stream: str = ""
    omitted_bytes: int = 0
    result: Optional[Result] = None


@dataclass
class ApprovalRequest:
    """The server asks whether a process may start (`protocol.md` §7, `process/approve`)."""

    id: str
    process_id: str
    argv: List[str]
    cwd: Optional[str]
    env_names: List[str]
    tty: bool
    rule: Optional[str]
