"""Videos in datasets: AIPerf's ``video`` / ``videos`` fields (and mmgate's ``video_uuids``) parsed, bad
ones refused with the file, line and field named; the sliding-window generator's clips."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import av
import orjson
import pytest

from mmgate.bench.dataset import ImageEntry, load_dataset
from mmgate.bench.errors import DatasetError
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window
from mmgate.bench.videos import MAX_VIDEO_BYTES, make_clip, sniff_video_type
from tests.bench.conftest import write_jsonl
from tests.bench.test_dataset import DATA_URL as PNG_DATA_URL

CLIP = make_clip(32, 4, 4, "test")
CLIP_URL = "data:video/mp4;base64," + base64.b64encode(CLIP).decode()


@pytest.fixture
def clip_file(tmp_path: Path) -> Path:
    path = tmp_path / "clips" / "a.mp4"
    path.parent.mkdir()
    path.write_bytes(CLIP)
    return path


def test_video_fields_parse_in_order_after_images(tmp_path: Path, clip_file: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"session_id": "s", "text": "a", "video": "clips/a.mp4"},
        {"session_id": "s", "text": "b", "images": [PNG_DATA_URL], "videos": ["clips/a.mp4", "", CLIP_URL],
         "video_uuids": ["v0", "v1", None]},
        {"session_id": "s", "video_uuids": ["only-ref"]},
        {"session_id": "s", "videos": [{"name": "v", "contents": ["https://example.com/v.mp4"], "uuids": ["u"]}]},
    ])
    turns = load_dataset(path, "single_turn")[0].turns
    local = str(clip_file.resolve())
    assert turns[0].images == (ImageEntry(local, None, "video"),)
    assert turns[1].images == (ImageEntry(PNG_DATA_URL, None), ImageEntry(local, "v0", "video"),
                               ImageEntry(None, "v1", "video"), ImageEntry(CLIP_URL, None, "video"))
    assert turns[2].images == (ImageEntry(None, "only-ref", "video"),)
    assert turns[3].images == (ImageEntry("https://example.com/v.mp4", "u", "video"),)


def test_multi_turn_videos(tmp_path: Path, clip_file: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [{"session_id": "c", "turns": [
        {"text": "q1", "videos": ["clips/a.mp4"]}, {"text": "q2", "video_uuids": ["k"]}]}])
    (session,) = load_dataset(path, "multi_turn")
    assert session.has_videos and [t.images[0].kind for t in session.turns] == ["video", "video"]


@pytest.mark.parametrize(
    ("row", "field", "fragment"),
    [
        ({"videos": ["pics/not-a-clip.png"]}, "videos[0]", "not a video"),
        ({"video": PNG_DATA_URL}, "video", "not a video"),
        ({"videos": ["clips/huge.mp4"]}, "videos[0]", "too large"),
        ({"video": "data:video/mp4;base64," + "A" * (MAX_VIDEO_BYTES // 3 * 4 + 8)}, "video", "too large"),
        ({"videos": "clips/a.mp4"}, "videos", "expected a list"),
        ({"videos": [7]}, "videos[0]", "expected a video string"),
        ({"video": ["clips/a.mp4"]}, "video", "expected a non-empty video string"),
        ({"videos": [{"contents": "clips/a.mp4"}]}, "videos[0].contents", "expected a list"),
        ({"video": "clips/a.mp4", "videos": ["clips/a.mp4"]}, "videos", "cannot be set together"),
        ({"videos": ["clips/a.mp4"], "video_uuids": ["a", "b"]}, "video_uuids", "align one-to-one"),
        ({"videos": [""]}, "videos[0]", "needs a uuid (video_uuids)"),
        ({"video": "clips/missing.mp4"}, "video", "video file not found"),
        ({"video": "data:video/mp4,xyz"}, "video", "base64"),
        ({"text": "a", "audio": "x.wav"}, "audio", "not supported"),
    ],
)
def test_bad_video_fields_name_the_field(tmp_path: Path, clip_file: Path, row: dict, field: str,
                                         fragment: str) -> None:
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "not-a-clip.png").write_bytes(base64.b64decode(PNG_DATA_URL.partition(",")[2]))
    with (tmp_path / "clips" / "huge.mp4").open("wb") as f:  # a sparse file over the limit
        f.write(CLIP[:64])
        f.truncate(MAX_VIDEO_BYTES + 1)
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, row])
    with pytest.raises(DatasetError) as info:
        load_dataset(path, "single_turn")
    assert (info.value.line, info.value.field) == (2, field)
    assert fragment in str(info.value)


def test_clips_are_distinct_deterministic_mp4s() -> None:
    assert sniff_video_type(CLIP) == ("video/mp4", ".mp4")
    assert make_clip(32, 4, 4, "test") == CLIP != make_clip(32, 4, 4, "other")
    with av.open(io.BytesIO(make_clip(64, 8, 4, "x")), mode="r") as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height, stream.codec_context.name) == (64, 64, "mpeg4")
        assert len(list(container.decode(stream))) == 8
    with pytest.raises(ValueError, match="even"):
        make_clip(33, 2, 4, "odd")


def test_generator_writes_a_video_sliding_window(tmp_path: Path) -> None:
    spec = SlidingWindowSpec(sessions=2, turns=3, window=2, image_size=32, media="video", author_uuids=True)
    made = generate_sliding_window(spec, tmp_path)
    assert (made.media, made.images, made.requests) == ("video", 2 * 4, 6)
    rows = [orjson.loads(line) for line in made.path.read_bytes().splitlines()]
    assert rows[1]["videos"] == ["videos/s0000_0001.mp4", "videos/s0000_0002.mp4"]
    assert rows[1]["video_uuids"] == ["sw-0000-vid-0001", "sw-0000-vid-0002"]
    assert "images" not in rows[1]
    sessions = load_dataset(made.path, "single_turn")
    assert all(e.kind == "video" for s in sessions for t in s.turns for e in t.images)
    with pytest.raises(ValueError, match="even"):
        SlidingWindowSpec(image_size=33, media="video").validate()
