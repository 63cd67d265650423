"""AIPerf-compatible datasets: ``single_turn`` and ``multi_turn`` JSONL, parsed into sessions.

Field names follow AIPerf's custom dataset loaders (``ai-dynamo/aiperf``,
``aiperf/dataset/loader/models.py``):

* ``single_turn`` — one request per line: ``text`` | ``texts``, ``image`` | ``images``,
  ``image_uuids`` (aligned one-to-one with ``images``; ``null`` entries allowed), ``session_id``,
  ``delay`` | ``timestamp`` (milliseconds), ``output_length``, ``role``, ``extra``. Lines sharing a
  ``session_id`` are sent in file order, one after the other; each line is self-contained (no
  history is accumulated). A line without ``session_id`` is a session of its own.
* ``multi_turn`` — one conversation per line: ``{"session_id": ..., "turns": [<single_turn>...]}``.
  Every request carries the whole conversation so far, the server's replies threaded back in as
  assistant messages. A leading text-only ``system`` turn becomes the system prompt of every
  request (as AIPerf does). Lines sharing a ``session_id`` are joined.

An image string is an ``http(s)://`` URL, a ``data:`` URL or a local file path (relative paths are
resolved against the dataset file's folder). An empty or ``null`` image with a uuid in
``image_uuids`` — or ``image_uuids`` without ``images`` — is a cache-only reference, sent as
``{"type": "image_url", "image_url": null, "uuid": K}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from mmgate.bench.errors import DatasetError

DatasetType = Literal["single_turn", "multi_turn"]
DATASET_TYPES: tuple[DatasetType, ...] = ("single_turn", "multi_turn")

_TURN_FIELDS = frozenset(
    {"type", "text", "texts", "image", "images", "image_uuids", "session_id", "delay", "timestamp",
     "output_length", "role", "extra"}
)
_UNSUPPORTED = frozenset({"audio", "audios", "video", "videos"})
MAX_UUID_LENGTH = 256


@dataclass(frozen=True, slots=True)
class ImageEntry:
    """One image of a turn. ``source`` None: a cache-only reference to ``uuid``.

    ``source`` is an absolute file path, an ``http(s)://`` URL or a ``data:`` URL.
    """

    source: str | None
    uuid: str | None

    @property
    def is_cache_only(self) -> bool:
        return self.source is None

    @property
    def is_local_file(self) -> bool:
        return self.source is not None and not self.source.startswith(("http://", "https://", "data:"))


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session as the dataset describes it."""

    texts: tuple[str, ...]
    images: tuple[ImageEntry, ...]
    role: str = "user"
    delay_ms: float | None = None
    timestamp_ms: float | None = None
    output_length: int | None = None
    extra: Mapping[str, Any] | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """Turns sent in order, never overlapping. ``accumulate_history``: multi-turn conversation."""

    session_id: str
    turns: tuple[Turn, ...]
    accumulate_history: bool
    system_prompt: str | None = None

    @property
    def num_images(self) -> int:
        return sum(len(t.images) for t in self.turns)


def load_dataset(path: Path | str, dataset_type: DatasetType) -> list[Session]:
    """Read a JSONL dataset; raise ``DatasetError`` naming file, line and field on a bad line."""
    file = Path(path)
    if dataset_type not in DATASET_TYPES:
        raise DatasetError(file, 0, "--dataset-type", f"expected one of {', '.join(DATASET_TYPES)}")
    if dataset_type == "single_turn":
        return _load_single_turn(file)
    return _load_multi_turn(file)


def _read_jsonl(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = file.open("rb")
    except OSError as exc:
        raise DatasetError(file, 0, "(file)", f"cannot open: {exc.strerror or exc}") from exc
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise DatasetError(file, number, "(line)", f"not valid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise DatasetError(file, number, "(line)", "expected a JSON object")
            yield number, row


def _load_single_turn(file: Path) -> list[Session]:
    groups: dict[str, list[Turn]] = {}
    for number, row in _read_jsonl(file):
        parser = _TurnParser(file, number, "")
        turn = parser.turn(row)
        sid = parser.optional_str(row, "session_id")
        key = sid if sid is not None else f"line-{number}"
        groups.setdefault(key, []).append(turn)
    if not groups:
        raise DatasetError(file, 0, "(file)", "the dataset has no lines")
    return [Session(sid, tuple(turns), accumulate_history=False) for sid, turns in groups.items()]


def _load_multi_turn(file: Path) -> list[Session]:
    groups: dict[str, list[Turn]] = {}
    for number, row in _read_jsonl(file):
        unknown = sorted(set(row) - {"session_id", "turns", "type"})
        if unknown:
            raise DatasetError(file, number, unknown[0], "unknown field of a multi_turn line")
        sid = _TurnParser(file, number, "").optional_str(row, "session_id")
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            raise DatasetError(file, number, "turns", "expected a non-empty list of turns")
        parsed = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict):
                raise DatasetError(file, number, f"turns[{i}]", "expected a JSON object")
            parsed.append(_TurnParser(file, number, f"turns[{i}].").turn(t))
        groups.setdefault(sid if sid is not None else f"line-{number}", []).extend(parsed)
    if not groups:
        raise DatasetError(file, 0, "(file)", "the dataset has no lines")
    sessions = []
    for sid, turns in groups.items():
        system = None
        first = turns[0]
        if len(turns) > 1 and first.role == "system" and not first.images and _is_plain(first):
            system = "\n".join(first.texts)
            turns = turns[1:]
        sessions.append(Session(sid, tuple(turns), accumulate_history=True, system_prompt=system))
    return sessions


def _is_plain(turn: Turn) -> bool:
    return (turn.delay_ms is None and turn.timestamp_ms is None and turn.output_length is None
            and turn.extra is None)


class _TurnParser:
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
                raise self.fail(field, "audio and video are not supported by mmgate bench")
            if field not in _TURN_FIELDS:
                raise self.fail(field, "unknown field (expected one of AIPerf's: "
                                       + ", ".join(sorted(_TURN_FIELDS)) + ")")
        texts = self._texts(row)
        images = self._images(row)
        if not texts and not images:
            raise self.fail("text", "a turn needs at least one text or image")
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
        return Turn(texts, images, role, delay, timestamp, output_length, extra, self.line)

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

    def _images(self, row: Mapping[str, Any]) -> tuple[ImageEntry, ...]:
        image, images, uuids = row.get("image"), row.get("images"), row.get("image_uuids")
        if image is not None and images is not None:
            raise self.fail("images", "image and images cannot be set together")
        if image is not None:
            if uuids is not None:
                raise self.fail("image_uuids", "image_uuids cannot be used with the singular image field")
            if not isinstance(image, str) or not image:
                raise self.fail("image", "expected a non-empty string (URL, data: URL or file path)")
            return (self._entry("image", image, None),)
        sources: list[tuple[str, Any, Any]] = []  # (field, source, uuid)
        if images is not None:
            if not isinstance(images, list):
                raise self.fail("images", "expected a list")
            for i, item in enumerate(images):
                if isinstance(item, dict):
                    sources.extend(self._image_object(i, item))
                else:
                    sources.append((f"images[{i}]", item, None))
        if uuids is not None:
            if not isinstance(uuids, list):
                raise self.fail("image_uuids", "expected a list of strings (null entries allowed)")
            if images is None:
                sources = [(f"image_uuids[{i}]", None, None) for i in range(len(uuids))]
            if any(isinstance(item, dict) for item in images or ()):
                raise self.fail("image_uuids", "not allowed with {name, contents} image objects: "
                                               "set their uuids instead")
            if len(uuids) != len(sources):
                raise self.fail("image_uuids", f"has {len(uuids)} entries but images has "
                                               f"{len(sources)}: they must align one-to-one")
            sources = [(field, src, uuids[i]) for i, (field, src, _) in enumerate(sources)]
        out = []
        for i, (field, src, uuid) in enumerate(sources):
            uuid_field = f"image_uuids[{i}]" if uuids is not None else field + ".uuid"
            out.append(self._entry(field, src, self._uuid(uuid_field, uuid)))
        return tuple(out)

    def _image_object(self, i: int, item: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
        contents, uuids = item.get("contents"), item.get("uuids")
        if not isinstance(contents, list):
            raise self.fail(f"images[{i}].contents", "expected a list of image strings")
        if uuids is not None and (not isinstance(uuids, list) or len(uuids) != len(contents)):
            raise self.fail(f"images[{i}].uuids", "expected a list aligned one-to-one with contents")
        return [
            (f"images[{i}].contents[{j}]", src, uuids[j] if uuids is not None else None)
            for j, src in enumerate(contents)
        ]

    def _uuid(self, field: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > MAX_UUID_LENGTH:
            raise self.fail(field, f"expected a non-empty string of at most {MAX_UUID_LENGTH} characters")
        return value

    def _entry(self, field: str, source: Any, uuid: str | None) -> ImageEntry:
        if source is None or source == "":
            if uuid is None:
                raise self.fail(field, "an empty image is a cache-only reference and needs a uuid "
                                       "(image_uuids)")
            return ImageEntry(None, uuid)
        if not isinstance(source, str):
            raise self.fail(field, "expected a string (URL, data: URL or file path)")
        if source.startswith(("http://", "https://")):
            return ImageEntry(source, uuid)
        if source.startswith("data:"):
            if ";base64," not in source[:100]:
                raise self.fail(field, "a data: URL must be base64 (data:<mime>;base64,...)")
            return ImageEntry(source, uuid)
        path = Path(source).expanduser()
        if not path.is_absolute():
            path = self.file.parent / path
        if not path.is_file():
            raise self.fail(field, f"image file not found: {path}")
        return ImageEntry(str(path.resolve()), uuid)
