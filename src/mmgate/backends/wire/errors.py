"""The lean client's errors: what failed on the wire, and whether the reply's head had arrived
(``HTTPBackend`` maps them to mmgate's gateway errors)."""

from __future__ import annotations


class WireError(Exception):
    """A request that failed on the wire. ``answered``: the reply's head had arrived."""

    answered = False


class ConnectFailed(WireError):
    """No connection could be made (refused, unreachable, or not within the connect timeout)."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class PoolFull(WireError):
    """Every connection the pool may hold is in use and none came free within the connect timeout."""


class ReadTimeout(WireError):
    """The backend sent nothing for the read timeout while its reply was awaited."""


class BrokenOff(WireError):
    """The connection closed before the reply was whole."""


class BadReply(WireError):
    """The backend's bytes are not an HTTP/1.1 reply."""


def failure(kind: type[WireError], reason: str, answered: bool) -> WireError:
    """A ``kind`` error that knows whether the reply's head had arrived."""
    exc = kind(reason)
    exc.answered = answered
    return exc
