"""One turn object of a dataset line, validated: every error names ``file:line: <field>``.

Media fields follow AIPerf's: ``image`` | ``images`` and ``video`` | ``videos`` (a string each, or
``{"name", "contents": [..]}`` objects), plus mmgate's ``image_uuids`` / ``video_uuids`` aligned
one-to-one with them (``null`` entries allowed; without the media list, every uuid is a cache-only
reference). A video must be one (``mmgate.bench.videos``): a file or ``data:`` URL of a video
container within ``MAX_VIDEO_BYTES``, or an ``http(s)`` URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmgate.bench.errors import DatasetError
from mmgate.bench.turn import ImageEntry, MediaKind, Turn
from mmgate.bench.videos import MAX_VIDEO_BYTES, sniff_video_type

TURN_FIELDS = frozenset(
    {"type", "text", "texts", "image", "images", "image_uuids", "video", "videos", "video_uuids", "session_id",
     "delay", "timestamp", "output_length", "role", "extra"}
)
_UNSUPPORTED = frozenset({"audio", "audios"})
MAX_UUID_LENGTH = 256
_SNIFF_BYTES = 64


class TurnParser:
    """Validates one turn object; every error names ``file:line: <prefix><field>``."""

    def __init__(self, file: Path, line: int, prefix: str) -> None:
        self.file = file
        self.line = line
        self.prefix = prefix

    def fail(self, field: str, message: str) -> DatasetError:
        return DatasetError(self.file, self.line, self.prefix + field, message)

    def optional_str(self, row: Mapping[str, Any], field: str) -> str | None:
        value = row.get(field)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(field, "expected a non-empty string")
        return value

    def _number(self, row: Mapping[str, Any], field: str) -> float | None:
        value = row.get(field)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.fail(field, "expected a number of milliseconds >= 0")
        return float(value)

    def turn(self, row: Mapping[str, Any]) -> Turn:
        for field in row:
            if field in _UNSUPPORTED:
                raise self.fail(field, "audio is not supported by mmgate bench")
            if field not in TURN_FIELDS:
                raise self.fail(field, "unknown field (expected one of AIPerf's: "
                                       + ", ".join(sorted(TURN_FIELDS)) + ")")
        texts = self._texts(row)
        media = self._media(row, "image") + self._media(row, "video")
        if not texts and not media:
            raise self.fail("text", "a turn needs at least one text, image or video")
        delay = self._number(row, "delay")
        timestamp = self._number(row, "timestamp")
        if delay is not None and timestamp is not None:
            raise self.fail("delay", "delay and timestamp cannot be set together")
        output_length = row.get("output_length")
        if output_length is not None and (
            isinstance(output_length, bool) or not isinstance(output_length, int) or output_length <= 0
        ):
            raise self.fail("output_length", "expected an integer > 0")
        extra = row.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise self.fail("extra", "expected a JSON object of request body fields")
        role = self.optional_str(row, "role") or "user"
        return Turn(texts, media, role, delay, timestamp, output_length, extra, self.line)

    def _texts(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        text, texts = row.get("text"), row.get("texts")
        if text is not None and texts is not None:
            raise self.fail("texts", "text and texts cannot be set together")
        if text is not None:
            if not isinstance(text, str):
                raise self.fail("text", "expected a string")
            return (text,)
        if texts is None:
            return ()
        if not isinstance(texts, list):
            raise self.fail("texts", "expected a list of strings or of {name, contents} objects")
        out: list[str] = []
        for i, item in enumerate(texts):
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and isinstance(item.get("contents"), list) and all(
                isinstance(c, str) for c in item["contents"]
            ):
                out.extend(item["contents"])
            else:
                raise self.fail(f"texts[{i}]", "expected a string or {name, contents: [strings]}")
        return tuple(out)

    def _media(self, row: Mapping[str, Any], kind: MediaKind) -> tuple[ImageEntry, ...]:
        one, many, uuids_field = kind, kind + "s", kind + "_uuids"
        single, items, uuids = row.get(one), row.get(many), row.get(uuids_field)
        what = f"{kind} string (URL, data: URL or file path)"
        if single is not None and items is not None:
            raise self.fail(many, f"{one} and {many} cannot be set together")
        if single is not None:
            if uuids is not None:
                raise self.fail(uuids_field, f"{uuids_field} cannot be used with the singular {one} field")
            if not isinstance(single, str) or not single:
                raise self.fail(one, f"expected a non-empty {what}")
            return (self._entry(kind, one, single, None),)
        sources: list[tuple[str, Any, Any]] = []  # (field, source, uuid)
        if items is not None:
            if not isinstance(items, list):
                raise self.fail(many, f"expected a list of {kind} strings or of {{name, contents}} objects")
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    sources.extend(self._media_object(many, i, item))
                else:
                    sources.append((f"{many}[{i}]", item, None))
        if uuids is not None:
            if not isinstance(uuids, list):
                raise self.fail(uuids_field, "expected a list of strings (null entries allowed)")
            if items is None:
                sources = [(f"{uuids_field}[{i}]", None, None) for i in range(len(uuids))]
            if any(isinstance(item, dict) for item in items or ()):
                raise self.fail(uuids_field, f"not allowed with {{name, contents}} {kind} objects: "
                                             "set their uuids instead")
            if len(uuids) != len(sources):
                raise self.fail(uuids_field, f"has {len(uuids)} entries but {many} has "
                                             f"{len(sources)}: they must align one-to-one")
            sources = [(field, src, uuids[i]) for i, (field, src, _) in enumerate(sources)]
        out = []
        for i, (field, src, uuid) in enumerate(sources):
            uuid_field = f"{uuids_field}[{i}]" if uuids is not None else field + ".uuid"
            out.append(self._entry(kind, field, src, self._uuid(uuid_field, uuid)))
        return tuple(out)

    def _media_object(self, many: str, i: int, item: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
        contents, uuids = item.get("contents"), item.get("uuids")
        if not isinstance(contents, list):
            raise self.fail(f"{many}[{i}].contents", f"expected a list of {many[:-1]} strings")
        if uuids is not None and (not isinstance(uuids, list) or len(uuids) != len(contents)):
            raise self.fail(f"{many}[{i}].uuids", "expected a list aligned one-to-one with contents")
        return [
            (f"{many}[{i}].contents[{j}]", src, uuids[j] if uuids is not None else None)
            for j, src in enumerate(contents)
        ]

    def _uuid(self, field: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_UUID_LENGTH:
            raise self.fail(field, f"expected a non-empty string of at most {MAX_UUID_LENGTH} characters")
        return value

    def _entry(self, kind: MediaKind, field: str, source: Any, uuid: str | None) -> ImageEntry:
        if source is None or source == "":
            if uuid is None:
                raise self.fail(field, f"an empty {kind} is a cache-only reference and needs a uuid "
                                       f"({kind}_uuids)")
            return ImageEntry(None, uuid, kind)
        if not isinstance(source, str):
            raise self.fail(field, f"expected a {kind} string (URL, data: URL or file path)")
        if source.startswith(("http://", "https://")):
            return ImageEntry(source, uuid, kind)
        if source.startswith("data:"):
            head = source[:100]
            if ";base64," not in head:
                raise self.fail(field, "a data: URL must be base64 (data:<mime>;base64,...)")
            if kind == "video":
                self._check_data_video(field, source, head)
            return ImageEntry(source, uuid, kind)
        path = Path(source).expanduser()
        if not path.is_absolute():
            path = self.file.parent / path
        if not path.is_file():
            raise self.fail(field, f"{kind} file not found: {path}")
        if kind == "video":
            self._check_video_file(field, path)
        return ImageEntry(str(path.resolve()), uuid, kind)

    def _check_data_video(self, field: str, source: str, head: str) -> None:
        mime = head[5:head.index(";")].lower()
        if not mime.startswith("video/"):
            raise self.fail(field, f"not a video: a data: video must be data:video/<type>;base64,... "
                                   f"(got {mime or 'no'} MIME type)")
        payload = len(source) - source.index(",") - 1
        if payload * 3 // 4 > MAX_VIDEO_BYTES:
            raise self.fail(field, f"too large: the video is over {MAX_VIDEO_BYTES >> 20} MiB")

    def _check_video_file(self, field: str, path: Path) -> None:
        size = path.stat().st_size
        if size > MAX_VIDEO_BYTES:
            raise self.fail(field, f"too large: {path} is {size >> 20} MiB, over {MAX_VIDEO_BYTES >> 20} MiB")
        with path.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
        if sniff_video_type(head) is None:
            raise self.fail(field, f"not a video: {path} is not an MP4, QuickTime, Matroska/WebM or AVI file")
