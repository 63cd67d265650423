"""AIPerf-compatible datasets: ``single_turn`` and ``multi_turn`` JSONL, parsed into sessions.

Field names follow AIPerf's custom dataset loaders (``ai-dynamo/aiperf``,
``aiperf/dataset/loader/models.py``):

* ``single_turn`` — one request per line: ``text`` | ``texts``, ``image`` | ``images``,
  ``image_uuids`` (aligned one-to-one with ``images``; ``null`` entries allowed), ``video`` |
  ``videos`` and ``video_uuids`` (the same for ``video_url`` parts), ``session_id``,
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
``{"type": "image_url", "image_url": null, "uuid": K}`` (a video's the same, as ``video_url``).
Turns are validated by ``mmgate.bench.turn_parser``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from mmgate.bench.errors import DatasetError
from mmgate.bench.turn import ImageEntry, MediaKind, Session, Turn
from mmgate.bench.turn_parser import MAX_UUID_LENGTH, TurnParser

__all__ = ["DATASET_TYPES", "MAX_UUID_LENGTH", "DatasetType", "ImageEntry", "MediaKind", "Session", "Turn",
           "load_dataset"]

DatasetType = Literal["single_turn", "multi_turn"]
DATASET_TYPES: tuple[DatasetType, ...] = ("single_turn", "multi_turn")


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
        parser = TurnParser(file, number, "")
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
        sid = TurnParser(file, number, "").optional_str(row, "session_id")
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            raise DatasetError(file, number, "turns", "expected a non-empty list of turns")
        parsed = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict):
                raise DatasetError(file, number, f"turns[{i}]", "expected a JSON object")
            parsed.append(TurnParser(file, number, f"turns[{i}].").turn(t))
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
