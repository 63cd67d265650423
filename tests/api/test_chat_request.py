"""Every accepted and rejected image-part shape of the client contract, at the parser (no I/O)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mmgate.api.chat_request import parse_chat_request
from mmgate.errors import InvalidRequestError

URL = "https://images.example/cat.png"


def body(*parts: Any, **extra: Any) -> bytes:
    msg = {"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}
    return orjson.dumps({"model": "m", "messages": [{"role": "system", "content": "s"}, msg], **extra})


def parse(raw: bytes) -> Any:
    return parse_chat_request(raw, max_images=4, max_uuid_length=256)


@pytest.mark.parametrize(
    ("part", "url", "uuid"),
    [
        ({"type": "image_url", "image_url": {"url": URL}}, URL, None),
        ({"type": "image_url", "image_url": {"url": URL}, "uuid": "u1"}, URL, "u1"),
        ({"type": "image_url", "image_url": None, "uuid": "u1"}, None, "u1"),
        ({"type": "image_url", "image_url": {}, "uuid": "u1"}, None, "u1"),
        ({"type": "image_url", "image_url": {"url": ""}, "uuid": "u1"}, None, "u1"),
        ({"type": "image_url", "uuid": "u1"}, None, "u1"),
        ({"type": "image_url", "image_url": {"url": URL, "uuid": "n1"}}, URL, "n1"),
        ({"type": "image_url", "image_url": {"url": URL, "uuid": "u1"}, "uuid": "u1"}, URL, "u1"),
        ({"type": "image_url", "image_url": {"url": URL}, "uuid": None}, URL, None),
        ({"image_url": URL}, URL, None),
        ({"type": "input_image", "image_url": URL, "detail": "original"}, URL, None),
    ],
)
def test_accepted_image_shapes(part: dict[str, Any], url: str | None, uuid: str | None) -> None:
    req = parse(body(part))
    assert len(req.slots) == 1
    slot = req.slots[0]
    assert (slot.url, slot.uuid) == (url, uuid)
    assert (slot.url is None) == (url is None)
    assert slot.param == "messages[1].content[1]"
    assert slot.part is req.body["messages"][1]["content"][1]
    assert slot.part["type"] == "image_url" and set(slot.part) == {"type", "image_url"}


@pytest.mark.parametrize(
    ("part", "fragment"),
    [
        ({"type": "image_url", "image_url": None}, "neither"),
        ({"type": "image_url"}, "neither"),
        ({"type": "image_url", "image_url": {"url": ""}}, "neither"),
        ({"type": "image_url", "image_url": None, "uuid": ""}, "must not be empty"),
        ({"type": "image_url", "image_url": None, "uuid": 7}, "must be a string"),
        ({"type": "image_url", "image_url": None, "uuid": "x" * 257}, "longer than 256"),
        ({"type": "image_url", "image_url": {"url": URL, "uuid": "a"}, "uuid": "b"}, "differ"),
        ({"type": "image_url", "image_url": {"url": 5}}, "must be a string"),
        ({"type": "image_url", "image_url": 5}, "must be an object"),
        ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "w;x"}, "uuid": "a"}, "format"),
        ({"type": "audio_url", "audio_url": {"url": 5}, "uuid": "v"}, "'audio_url.url' must be a string"),
        # Shapes vLLM's typed parsers refuse (400), refused as vLLM refuses them.
        ({"type": "image_url", "image_url": URL}, "must be an object"),
        ({"type": "video_url", "video_url": URL}, "must be an object"),
        ({"type": "audio_url", "audio_url": URL}, "must be an object"),
        ({"type": "input_image", "image_url": URL}, "needs its 'detail'"),
        ({"type": "input_image", "image_url": {"url": URL}, "detail": "auto"}, "must be a URL string"),
    ],
)
def test_rejected_part_names_the_part(part: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(body(part))
    assert info.value.status == 400
    assert info.value.param == "messages[1].content[1]"
    assert fragment in info.value.message


def test_audio_and_video_are_rebuilt_and_their_urls_listed_for_the_policy() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}, "extra": 1}
    video = {"type": "video_url", "video_url": {"url": URL}, "zzz": 2}
    req = parse(body(audio, video))
    assert req.slots == []
    assert req.body["messages"][1]["content"][1] == {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
    assert req.body["messages"][1]["content"][2] == {"type": "video_url", "video_url": {"url": URL}}
    assert [(p.kind, p.url, p.param) for p in req.passthrough] == [
        ("input_audio", "data:audio/wav;base64,AA==", "messages[1].content[1]"), ("video_url", URL, "messages[1].content[2]")]


def test_too_many_images_names_the_first_extra_part() -> None:
    parts = [{"type": "image_url", "image_url": {"url": URL}} for _ in range(5)]
    with pytest.raises(InvalidRequestError) as info:
        parse(body(*parts))
    assert info.value.param == "messages[1].content[5]"
    assert "too many images" in info.value.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"model": "", "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": ["x"]}', "messages[0]"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"model": "m", "messages": [{"role": "user", "content": [5]}]}', "messages[0].content[0]"),
        (b'{"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}', "stream"),
    ],
)
def test_malformed_bodies(raw: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(raw)
    assert info.value.param == param


def test_unknown_fields_are_kept_and_images_indexed_in_order() -> None:
    raw = body(
        {"type": "image_url", "image_url": {"url": URL}},
        {"type": "image_url", "image_url": None, "uuid": "u2"},
        top_k=5, mm_processor_kwargs={"fps": 1}, stream=True,
    )
    req = parse(raw)
    assert req.body["top_k"] == 5 and req.body["mm_processor_kwargs"] == {"fps": 1}
    assert req.stream is True
    assert [s.index for s in req.slots] == [0, 1]


@pytest.mark.parametrize("padding", [0, 100, 70_000])  # brackets in a string: the walk decides, small or large
def test_nesting_past_the_limit_is_refused_however_many_brackets_strings_hold(padding: int) -> None:
    def body(depth: int) -> bytes:
        nested: Any = "x"
        for _ in range(depth - 3):  # the body, messages and the message are the first 3 levels
            nested = [nested]
        message = {"role": "user", "content": "{[" * padding + "hi", "extra": nested}
        return orjson.dumps({"model": "m", "messages": [message]})

    limits = {"max_images": 8, "max_uuid_length": 64, "max_depth": 8}
    assert parse_chat_request(body(8), **limits).model == "m"
    with pytest.raises(InvalidRequestError, match="deeper than 8 levels"):
        parse_chat_request(body(9), **limits)
