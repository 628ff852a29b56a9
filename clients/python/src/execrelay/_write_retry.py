"""When a refused write (or start) is sent again (the Rust library's `client/write_retry.rs`,
the same policy).

A server whose `initialize` result says ``capabilities.retryRefusedWrites`` keeps a process's
writes in order after refusing one for a limit (``-32004``): every later write of that process
is refused too (``data.limit`` ``writeOrder``) until the refused one comes again. So a refused
write is not lost input, only input that came too early: the client waits, then sends it again
alone, and once it is accepted every write after it, in order (sent with it, they would only be
refused again, each charged to the server's full budget first). Pauses from `WRITE_RETRY_FIRST`
doubling to `WRITE_RETRY_MAX`, for at most `write_retry_for` seconds from the first of the
refusals in a row, round trips included (an accepted write starts over); never for a byte limit
smaller than the write, nor on a server that did not promise the order.
"""

from typing import Any, Optional

#: The first pause (seconds) before a refused write is sent again.
WRITE_RETRY_FIRST = 0.005
#: The longest pause (seconds) between two tries.
WRITE_RETRY_MAX = 0.5
#: How long (seconds) refusals in a row are tried again by default.
WRITE_RETRY_FOR = 60.0

#: The limits whose ``-32004`` a start is tried again on: requests in flight and their bytes,
#: which empty as other requests are answered (a request refused for them was refused before
#: it was read, so nothing was started). Not ``maxProcesses`` and its kin.
TRANSIENT_LIMITS = ("maxPendingRequests", "maxPendingControlRequests", "maxPendingRequestBytes",
                    "maxInboundBytes")


def transient_limit(code: int, data: Any) -> bool:
    """Whether a refusal is for a limit that empties by itself (`TRANSIENT_LIMITS`)."""
    return code == -32004 and isinstance(data, dict) and data.get("limit") in TRANSIENT_LIMITS


#: The byte limits a write is charged to: ``data.value`` is their size in bytes.
_BYTE_LIMITS = ("maxPendingRequestBytes", "maxInboundBytes")

#: What a binary write is charged beside its bytes (the server's bookkeeping).
_BINARY_WRITE_OVERHEAD = 1024


def write_cost(length: int, binary: bool) -> int:
    """The least the server charges a write of `length` bytes: a binary one exactly its length
    and bookkeeping, a JSON one at least its base64 text."""
    return length + _BINARY_WRITE_OVERHEAD if binary else (length + 2) // 3 * 4


#: What one JSON value can take on the server once parsed, beyond its text: a message is
#: charged its length plus this for each ``,`` ``:`` ``[`` ``{`` in it, before it is parsed
#: (the server's ``PARSED_VALUE_BYTES``, ``src/connection/request_budget.rs``).
PARSED_VALUE_BYTES = 128


def parse_cost(text: bytes) -> int:
    """What the server charges a message of this text: its length, and
    ``PARSED_VALUE_BYTES`` for each value it can hold."""
    values = text.count(b",") + text.count(b":") + text.count(b"[") + text.count(b"{")
    return len(text) + values * PARSED_VALUE_BYTES


class WriteRetry:
    """Refusals in a row of one `write()`, and the next pause."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.next = WRITE_RETRY_FIRST
        #: When (a monotonic clock, seconds) the first of the refusals in a row came.
        self.since: Optional[float] = None
        #: Refused writes sent again, in all.
        self.tries = 0

    def after_refusal(self, code: int, data: Any, cost: int, promised: bool,
                      now: float) -> Optional[float]:
        """The pause before the refused write goes again, or None: give up. `now` is a
        monotonic clock's time (seconds), so that round trips count as well as pauses."""
        if not promised or code != -32004 or _never_fits(data, cost):
            return None
        if self.since is None:
            self.since = now
        if now - self.since >= self.limit:
            return None
        pause = self.next
        self.tries += 1
        self.next = min(self.next * 2, WRITE_RETRY_MAX)
        return pause

    def accepted(self) -> None:
        """A write was accepted: the next refusal starts over."""
        self.next = WRITE_RETRY_FIRST
        self.since = None


def _never_fits(data: Any, cost: int) -> bool:
    if not isinstance(data, dict):
        return False
    limit, value = data.get("limit"), data.get("value")
    return limit in _BYTE_LIMITS and isinstance(value, int) and value < cost
