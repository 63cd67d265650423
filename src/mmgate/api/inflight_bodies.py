"""The request bodies the gateway holds at once, bounded in bytes (``--max-body-bytes-in-flight``).

``--max-body-bytes`` bounds one body; this bounds them together, so that many clients sending large
bodies at once cannot take the process past its memory limit. A body counts from before its first
byte is read until its request ends, however it ends (answered, refused, its client gone): the
parsed body and the bodies built from it live that long, several times its size. Its bytes count
as they arrive, not as its ``Content-Length`` declares (a client that announces a large body and
sends it slowly holds only what it has sent). Past the limit the request is refused (429 with
``Retry-After``) before more of it is read — unless nothing else is held: one body alone is always
let in, ``--max-body-bytes`` bounds it.

Uploads streamed on to a backend as they arrive (``mmgate.api.forward.Upload``) are never held
whole and do not count. Pure bookkeeping on the event loop: no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from mmgate.errors import BusyError


class BodiesInFlightError(BusyError):
    """The gateway holds ``--max-body-bytes-in-flight`` of request bodies: come back shortly."""

    code = "request_bodies_in_flight"


_HELD = web.RequestKey("mmgate.body_bytes_held", int)


class InflightBodies:
    """Bytes of request bodies held at once, at most ``limit`` (module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def reserve(self, request: web.Request, num_bytes: int) -> None:
        """Count ``num_bytes`` more of ``request``'s body, or refuse it (429) past the limit."""
        if num_bytes <= 0:
            return
        mine = request.get(_HELD, 0)
        if self.held > mine and self.held + num_bytes > self.limit:
            raise BodiesInFlightError(
                f"the gateway holds {self.held} bytes of request bodies, near its "
                f"--max-body-bytes-in-flight of {self.limit}: retry shortly", param="body")
        self.held += num_bytes
        request[_HELD] = mine + num_bytes

    @contextmanager
    def scope(self, request: web.Request) -> Iterator[None]:
        """Releases what ``request`` reserved when the block ends."""
        try:
            yield
        finally:
            self.held -= request.pop(_HELD, 0)


BODIES_KEY = web.AppKey("inflight_bodies", InflightBodies)
