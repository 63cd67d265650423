"""The embedded engine's errors: a separate program, so a tree of its own (not the gateway's).

Each error carries the HTTP status vLLM answers with; ``mmgate.sim.wire`` turns it into
vLLM's error body.

    SimError                     500
    ├── InvalidRequestError      400: malformed body, bad part, cache miss without data
    │   ├── ImageTooLargeError   400: over the byte or pixel limit
    │   └── OriginError          400: an image URL could not be fetched
    ├── OriginTimeoutError       408: an image URL was too slow
    ├── ModelNotFoundError       404: not the served model
    └── ResponseNotFoundError    404: a stored response asked for (the sim stores none)
"""

from __future__ import annotations


class SimError(Exception):
    """Root of the embedded engine's errors."""

    status: int = 500

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(SimError):
    status = 400


class ImageTooLargeError(InvalidRequestError):
    pass


class OriginError(InvalidRequestError):
    pass


class OriginTimeoutError(SimError):
    status = 408


class ModelNotFoundError(SimError):
    status = 404


class ResponseNotFoundError(SimError):
    status = 404
