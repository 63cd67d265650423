"""AIPerf single_turn / multi_turn parsing, and errors that name file, line and field."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from mmgate.bench.dataset import ImageEntry, load_dataset
from mmgate.bench.errors import DatasetError
from mmgate.cli import main
from tests.bench.conftest import write_jsonl

PNG_1PX = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG_1PX).decode()


@pytest.fixture
def image_file(tmp_path: Path) -> Path:
    path = tmp_path / "pics" / "a.png"
    path.parent.mkdir()
    path.write_bytes(PNG_1PX)
    return path


def test_single_turn_fields_and_session_grouping(tmp_path: Path, image_file: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"session_id": "s1", "text": "hello", "image": "pics/a.png", "output_length": 7, "delay": 5},
        {"texts": ["a", "b"], "images": ["https://example.com/x.jpg", DATA_URL]},
        {"session_id": "s1", "texts": [{"name": "q", "contents": ["c", "d"]}], "timestamp": 10,
         "images": ["", DATA_URL, None], "image_uuids": ["u0", None, "u2"], "role": "user",
         "extra": {"temperature": 0}},
        {"image_uuids": ["only-ref"]},
    ])
    sessions = load_dataset(path, "single_turn")
    assert [s.session_id for s in sessions] == ["s1", "line-2", "line-4"]
    s1 = sessions[0]
    assert not s1.accumulate_history
    assert len(s1.turns) == 2
    first, third = s1.turns
    assert first.texts == ("hello",)
    assert first.images == (ImageEntry(str(image_file.resolve()), None),)
    assert (first.output_length, first.delay_ms, first.line) == (7, 5.0, 1)
    assert third.texts == ("c", "d")
    assert third.timestamp_ms == 10.0 and third.extra == {"temperature": 0}
    assert third.images == (ImageEntry(None, "u0"), ImageEntry(DATA_URL, None), ImageEntry(None, "u2"))
    assert sessions[1].turns[0].images[0].source == "https://example.com/x.jpg"
    assert sessions[2].turns[0].images == (ImageEntry(None, "only-ref"),)


def test_multi_turn_groups_turns_and_hoists_system_prompt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"session_id": "c1", "turns": [{"role": "system", "text": "be brief"}, {"text": "q1"}]},
        {"session_id": "c2", "turns": [{"text": "x", "images": [DATA_URL], "image_uuids": ["k"]}]},
        {"session_id": "c1", "turns": [{"text": "q2", "delay": 3}]},
    ])
    sessions = load_dataset(path, "multi_turn")
    c1, c2 = sessions
    assert c1.accumulate_history and c1.system_prompt == "be brief"
    assert [t.texts for t in c1.turns] == [("q1",), ("q2",)]
    assert c2.turns[0].images == (ImageEntry(DATA_URL, "k"),)


@pytest.mark.parametrize(
    ("row", "field", "fragment"),
    [
        ({"text": "a", "texts": ["b"]}, "texts", "cannot be set together"),
        ({"text": "a", "image_uuid": ["x"]}, "image_uuid", "unknown field"),
        ({"images": ["a.png"]}, "images[0]", "not found"),
        ({"images": [DATA_URL, DATA_URL], "image_uuids": ["x"]}, "image_uuids", "align one-to-one"),
        ({"images": [""]}, "images[0]", "needs a uuid"),
        ({"image_uuids": [None]}, "image_uuids[0]", "needs a uuid"),
        ({"images": [DATA_URL], "image_uuids": [""]}, "image_uuids[0]", "non-empty string"),
        ({"text": "a", "delay": 1, "timestamp": 2}, "delay", "cannot be set together"),
        ({"text": "a", "output_length": 0}, "output_length", "integer > 0"),
        ({"text": "a", "audio": "x.wav"}, "audio", "not supported"),
        ({"session_id": "s"}, "text", "at least one text, image or video"),
        ({"text": "a", "image": DATA_URL, "image_uuids": ["u"]}, "image_uuids", "singular"),
        ({"text": "a", "images": ["data:image/png,xyz"]}, "images[0]", "base64"),
    ],
)
def test_bad_single_turn_line_names_line_and_field(tmp_path: Path, row: dict, field: str, fragment: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, row])
    with pytest.raises(DatasetError) as info:
        load_dataset(path, "single_turn")
    err = info.value
    assert (err.line, err.field) == (2, field)
    assert fragment in str(err)
    assert str(err).startswith(f"{path}:2: {field}:")


def test_bad_json_and_bad_multi_turn(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": \n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:3: \(line\): not valid JSON"):
        load_dataset(path, "single_turn")
    multi = write_jsonl(tmp_path / "m.jsonl", [{"session_id": "a", "turns": [{"text": "x"}, {"texts": 3}]}])
    with pytest.raises(DatasetError) as info:
        load_dataset(multi, "multi_turn")
    assert (info.value.line, info.value.field) == (1, "turns[1].texts")
    empty = write_jsonl(tmp_path / "e.jsonl", [{"session_id": "a", "turns": []}])
    with pytest.raises(DatasetError, match="non-empty list of turns"):
        load_dataset(empty, "multi_turn")


def test_cli_bad_dataset_exits_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "ok"}, {"text": "a", "images": ["missing.png"]}])
    code = main(["bench", "run", "--url", "http://127.0.0.1:9", "--dataset", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:2: images[0]: image file not found" in err
    assert "Traceback" not in err


def test_cli_bad_flag_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", [{"text": "ok"}])
    code = main(["bench", "run", "--dataset", str(path), "--concurrency", "0", "--quiet"])
    assert code == 2
    assert "invalid setting --concurrency" in capsys.readouterr().err
    code = main(["bench", "run", "--dataset", str(path), "--extra-inputs", "novalue", "--quiet"])
    assert code == 2
    assert "invalid setting --extra-inputs" in capsys.readouterr().err
