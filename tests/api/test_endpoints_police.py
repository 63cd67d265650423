"""The pure parts of the passthrough endpoints: finding media fields in any JSON body, the byte
sniff that lets a text body skip the walk, and the multipart ``model`` field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mmgate.api.content_parts import MEDIA_KEYS
from mmgate.api.endpoints import form_model, is_conversation, model_of
from mmgate.api.police import may_carry_media, media_fields, police
from mmgate.errors import InvalidRequestError


def test_text_bodies_skip_the_walk_and_media_bodies_do_not() -> None:
    assert not may_carry_media(b'{"model":"m","prompt":"a url of a picture","input":["x"]}')
    for raw in (b'{"image_url":1}', b'{"x":{"audio_url":1}}', b'{"prompt_embeds":"A"}', b'{"\\u0069mage_url":1}',
                b'{"type":"input_audio"}', b'{"type":"input_image"}', b'{"image_embeds":1}'):
        assert may_carry_media(raw), raw
    # Every media key the parser knows is caught by the sniff.
    assert all(may_carry_media(orjson.dumps({key: 1})) for key in MEDIA_KEYS)


def test_media_fields_are_found_wherever_nested_but_not_in_schemas() -> None:
    body: dict[str, Any] = {
        "a": [{"b": {"type": "image_url", "image_url": {"url": "u"}}}],
        "c": {"content": [{"type": "text", "text": "t"}, {"video_url": "v"}]},
        "tools": [{"function": {"parameters": {"properties": {"image_url": {"type": "string"}}}}}],
        "response_format": {"json_schema": {"image_url": 1}},
    }
    assert sorted(p for p, *_ in media_fields(body, 64)) == ["a[0].b", "c.content[1]"]
    deep: Any = "x"
    for _ in range(70):
        deep = [deep]
    with pytest.raises(InvalidRequestError):
        media_fields({"a": deep}, 64)


async def test_police_rebuilds_parts_and_names_what_it_refuses() -> None:
    checked: list[tuple[str, str, str]] = []

    async def check(url: str, param: str, kind: str) -> str:
        checked.append((url, param, kind))
        return url + "#checked"

    body: dict[str, Any] = {"messages": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://h/a.png", "detail": "low"},
        {"type": "image_url", "image_url": {"url": "http://h/b.png"}, "uuid": "label"},
        {"type": "audio_url", "audio_url": {"url": "http://h/a.wav"}}]}]}
    assert await police(body, check, max_uuid_length=64, max_depth=64)
    assert body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "http://h/a.png#checked", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "http://h/b.png#checked"}},  # the client's uuid dropped
        {"type": "audio_url", "audio_url": {"url": "http://h/a.wav#checked"}}]
    assert sorted(c[2] for c in checked) == ["audio_url", "image_url", "image_url"]
    assert not await police({"prompt": "x"}, check, max_uuid_length=64, max_depth=64)
    for bad, param in (({"prompt_embeds": "A"}, "prompt_embeds"),
                       ({"x": [{"type": "video_embeds", "video_embeds": "A"}]}, "x[0]"),
                       ({"x": [{"type": "image_url", "uuid": "u"}]}, "x[0]")):
        with pytest.raises(InvalidRequestError) as info:
            await police(bad, check, max_uuid_length=64, max_depth=64)
        assert info.value.param == param


def test_form_model_and_request_fields() -> None:
    head = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nxx\r\n'
            b'--b\r\ncontent-disposition: form-data; name="model"\r\nContent-Type: text/plain\r\n\r\n'
            b"whisper-x\r\n--b--\r\n")
    assert form_model(head) == "whisper-x"
    assert form_model(b'--b\r\nContent-Disposition: form-data; name="modelx"\r\n\r\nm\r\n--b') is None
    assert form_model(b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm') is None  # cut short
    with pytest.raises(InvalidRequestError):
        form_model(b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\n\xff\xfe\r\n--b')
    assert model_of({}) is None and model_of({"model": None}) is None and model_of({"model": "m"}) == "m"
    for bad in (3, "", ["m"]):
        with pytest.raises(InvalidRequestError):
            model_of({"model": bad})
    assert is_conversation([{"role": "user"}]) and not is_conversation([[{"role": "user"}]])
    assert not is_conversation([]) and not is_conversation("hi")
