"""Value types and tier protocols shared by the media loader and its caches."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Protocol

import pybase64


@dataclass(slots=True)
class LoadedImage:
    """Validated, encoded image bytes ready to forward.

    ``digest`` is the hex SHA-256 of ``data`` (the content hash). ``data_url`` is built once, on
    first use, and kept: the same image forwarded to several backends or turns is encoded once.
    """

    data: bytes
    mime: str
    width: int
    height: int
    digest: str
    _data_url: str | None = field(default=None, repr=False)

    @property
    def num_bytes(self) -> int:
        return len(self.data)

    @property
    def footprint_bytes(self) -> int:
        """Memory this image holds once its data URL is built (what caches count): the bytes, the
        data URL, the digest and mime strings and the object itself, each with its CPython header."""
        n = len(self.data)
        return _FIXED_BYTES + n + 4 * ((n + 2) // 3) + 2 * len(self.mime) + len("data:;base64,")

    def data_url(self) -> str:
        if self._data_url is None:
            self._data_url = f"data:{self.mime};base64," + pybase64.b64encode_as_string(self.data)
        return self._data_url


# The per-image constant of ``footprint_bytes``: the object, and the headers of its bytes, data URL,
# mime and 64-character digest strings.
_FIXED_BYTES = (
    sys.getsizeof(LoadedImage(b"", "", 0, 0, "")) + sys.getsizeof(b"") + 2 * sys.getsizeof("")
    + sys.getsizeof("0" * 64)
)


class SharedTier(Protocol):
    """A cache shared between gateway processes (Redis / Redis Cluster).

    Every method fails open: on any cache error it logs (rate-limited) and behaves as a miss, a
    no-op or "go fetch it yourself". None of them raises except ``asyncio.CancelledError``.
    """

    async def get(self, key: str) -> LoadedImage | None:
        """The entry, or None on a miss, an error or a corrupt entry (which is deleted)."""

    async def put(self, key: str, image: LoadedImage) -> None:
        """Store a validated image with the configured TTL."""

    async def acquire_fill_lease(self, key: str) -> bool:
        """True when this process should fetch from the origin (it holds the lease, or the cache
        is broken); False when another process holds it and is filling the entry."""

    async def wait_for_fill(self, key: str) -> LoadedImage | None:
        """Wait (bounded) for another process's fill; None when the lease expired or on error."""

    async def release_fill_lease(self, key: str) -> None:
        """Drop the lease early (after a failed fetch), so waiters fall back at once."""

    async def close(self) -> None: ...
