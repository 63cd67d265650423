"""Turn dataset image (and video) entries into what goes on the wire, once per image, in a bounded cache.

Two modes (``--image-mode``):

* ``data`` — local files are sent inline as ``data:<mime>;base64,...`` URLs;
* ``origin`` — local files are served by the built-in loopback image origin
  (:mod:`mmgate.bench.image_server`) and sent as ``http://127.0.0.1:PORT/images/<key>.<ext>`` URLs, so the
  server (or the gateway in front of it) downloads and caches them.

``http(s)://`` and ``data:`` entries are sent as they are in both modes. Every image gets a content
uuid for ``--uuid-and-strip``: the SHA-256 of its bytes (files, ``data:`` URLs) or of its URL
(``http(s)`` entries, which the client never downloads). File reads, base64 and hashing run in a
worker thread; the prepared strings live in an LRU bounded by bytes, and concurrent requests for
the same image share one preparation.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmgate.bench.dataset import ImageEntry
from mmgate.bench.errors import BenchError
from mmgate.bench.planner import TurnImage
from mmgate.bench.videos import sniff_video_type

ImageMode = Literal["data", "origin"]
IMAGE_MODES: tuple[ImageMode, ...] = ("data", "origin")

_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png", ".png"),
    (b"\xff\xd8\xff", "image/jpeg", ".jpg"),
    (b"GIF87a", "image/gif", ".gif"),
    (b"GIF89a", "image/gif", ".gif"),
    (b"BM", "image/bmp", ".bmp"),
)


def sniff_image_type(data: bytes) -> tuple[str, str]:
    """(mime, extension) of an image (or a video: ``mmgate.bench.videos``) from the first bytes;
    ``application/octet-stream`` when unknown."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", ".webp"
    for magic, mime, ext in _MAGIC:
        if data.startswith(magic):
            return mime, ext
    return sniff_video_type(data) or ("application/octet-stream", ".bin")


def content_uuid(data: bytes) -> str:
    """The uuid ``--uuid-and-strip`` gives an image without one: hex SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """A dataset image ready to send: wire URL, content uuid, size of the raw image."""

    url: str
    content_uuid: str
    num_bytes: int


class DatasetImages:
    """Prepares dataset images for the wire; one per run, shared by every session."""

    def __init__(self, mode: ImageMode, cache_bytes: int, origin_base_url: str | None = None) -> None:
        if mode == "origin" and not origin_base_url:
            raise BenchError("--image-mode origin needs the image origin's URL")
        self._mode = mode
        self._origin_base = (origin_base_url or "").rstrip("/")
        self._capacity = max(0, cache_bytes)
        self._cache: OrderedDict[str, PreparedImage] = OrderedDict()
        self._cached_bytes = 0
        self._inflight: dict[str, asyncio.Future[PreparedImage]] = {}
        # key (file name served by the origin) → absolute path; one entry per distinct file.
        self._origin_files: dict[str, str] = {}

    @property
    def mode(self) -> ImageMode:
        return self._mode

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def origin_path(self, name: str) -> str | None:
        """The file the origin serves as ``/images/<name>``; None for anything else."""
        return self._origin_files.get(name)

    async def slot(self, entry: ImageEntry) -> TurnImage:
        """The plannable form of a dataset image."""
        if entry.source is None:
            return TurnImage(None, entry.uuid, None, entry.kind)
        prepared = await self.prepare(entry.source)
        return TurnImage(prepared.url, entry.uuid, prepared.content_uuid, entry.kind)

    async def prepare(self, source: str) -> PreparedImage:
        """The wire form of ``source``; concurrent calls for one source share one preparation.

        When the caller doing the preparation is cancelled, the others are not: they start a
        preparation of their own rather than receive its cancellation.
        """
        cached = self._cache.get(source)
        if cached is not None:
            self._cache.move_to_end(source)
            return cached
        pending = self._inflight.get(source)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    return await self.prepare(source)  # the preparer was cancelled, not us
                raise
        future: asyncio.Future[PreparedImage] = asyncio.get_running_loop().create_future()
        self._inflight[source] = future
        try:
            prepared = await asyncio.to_thread(self._prepare_blocking, source)
        except asyncio.CancelledError:
            future.cancel()  # waiters see a cancelled preparation, not an error of theirs
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters (if any) re-raise it themselves
            raise
        finally:
            self._inflight.pop(source, None)
        future.set_result(prepared)
        self._store(source, prepared)
        return prepared

    async def prepare_all(self, entries: Iterable[ImageEntry]) -> tuple[int, int]:
        """Prepare distinct images ahead of the run while they fit the cache: (count, raw bytes)."""
        count = 0
        total = 0
        seen: set[str] = set()
        for entry in entries:
            if entry.source is None or entry.source in seen:
                continue
            seen.add(entry.source)
            prepared = await self.prepare(entry.source)
            count += 1
            total += prepared.num_bytes
            if self._cached_bytes + len(prepared.url) > self._capacity:
                break
        return count, total

    def _store(self, source: str, prepared: PreparedImage) -> None:
        size = len(prepared.url)
        if size > self._capacity:
            return
        self._cache[source] = prepared
        self._cached_bytes += size
        while self._cached_bytes > self._capacity and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= len(old.url)

    def _prepare_blocking(self, source: str) -> PreparedImage:
        if source.startswith(("http://", "https://")):
            return PreparedImage(source, content_uuid(source.encode()), 0)
        if source.startswith("data:"):
            _, _, payload = source.partition(",")
            try:
                raw = base64.b64decode(payload, validate=False)
            except (binascii.Error, ValueError) as exc:
                raise BenchError(f"undecodable data: URL in the dataset ({exc})") from exc
            return PreparedImage(source, content_uuid(raw), len(raw))
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise BenchError(f"cannot read image {source}: {exc.strerror or exc}") from exc
        digest = content_uuid(data)
        mime, ext = sniff_image_type(data)
        if self._mode == "origin":
            name = digest[:32] + ext
            self._origin_files[name] = source
            return PreparedImage(f"{self._origin_base}/images/{name}", digest, len(data))
        url = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
        return PreparedImage(url, digest, len(data))
