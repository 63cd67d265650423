"""The sliding-window generator: files, windows, and datasets the loader accepts."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from PIL import Image

from mmgate.bench.dataset import load_dataset
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from mmgate.cli import main


def test_single_turn_windows_slide_by_new_per_turn(tmp_path: Path) -> None:
    spec = SlidingWindowSpec(sessions=2, turns=3, window=3, new_per_turn=2, image_size=48, image_format="png",
                             output_length=8, delay_ms=20.0, author_uuids=True)
    made = generate_sliding_window(spec, tmp_path)
    assert (made.sessions, made.requests, made.images) == (2, 6, 2 * (3 + 2 * 2))
    rows = [orjson.loads(line) for line in made.path.read_bytes().splitlines()]
    assert len(rows) == 6
    s0 = [r for r in rows if r["session_id"] == "sw-0000"]
    assert [r["images"] for r in s0] == [
        ["images/s0000_0000.png", "images/s0000_0001.png", "images/s0000_0002.png"],
        ["images/s0000_0002.png", "images/s0000_0003.png", "images/s0000_0004.png"],
        ["images/s0000_0004.png", "images/s0000_0005.png", "images/s0000_0006.png"],
    ]
    assert s0[1]["image_uuids"] == ["sw-0000-img-0002", "sw-0000-img-0003", "sw-0000-img-0004"]
    assert "delay" not in s0[0] and s0[1]["delay"] == 20.0 and s0[0]["output_length"] == 8
    with Image.open(tmp_path / "images" / "s0001_0006.png") as im:
        assert im.size == (48, 48) and im.format == "PNG"
    a = (tmp_path / "images" / "s0000_0001.png").read_bytes()
    assert a != (tmp_path / "images" / "s0000_0002.png").read_bytes()
    assert a != (tmp_path / "images" / "s0001_0001.png").read_bytes()
    sessions = load_dataset(made.path, "single_turn")
    assert [len(s.turns) for s in sessions] == [3, 3]
    assert all(len(t.images) == 3 for s in sessions for t in s.turns)


def test_multi_turn_carries_new_images_only(tmp_path: Path) -> None:
    spec = SlidingWindowSpec(sessions=1, turns=3, window=2, image_size=32, dataset_type="multi_turn")
    made = generate_sliding_window(spec, tmp_path)
    (conv,) = [orjson.loads(line) for line in made.path.read_bytes().splitlines()]
    assert [len(t["images"]) for t in conv["turns"]] == [2, 1, 1]
    (session,) = load_dataset(made.path, "multi_turn")
    assert session.accumulate_history and session.num_images == 4


def test_cli_generates_and_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sw"
    code = main(["bench", "dataset", "sliding-window", "--sessions", "2", "--turns", "2", "--window", "2",
                 "--image-size", "32", "--out", str(out)])
    assert code == 0
    assert "2 sessions, 4 requests, 6 images" in capsys.readouterr().out
    assert (out / "sliding_window.jsonl").is_file()
    code = main(["bench", "dataset", "sliding-window", "--window", "2", "--new-per-turn", "3", "--out", str(out)])
    assert code == 2
    assert "--new-per-turn cannot exceed --window" in capsys.readouterr().err
