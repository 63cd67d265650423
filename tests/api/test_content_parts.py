"""Every content-part shape vLLM 0.32's chat parser acts on, at the parser (no I/O): each is either
rebuilt into the gateway's canonical form (an image slot, a policed pass-through URL, or a part vLLM
reads as text) or refused with a 400 naming the part. Nothing a backend would act on is forwarded as
it came."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mmgate.api.chat_request import MAX_JSON_DEPTH, parse_chat_request
from mmgate.api.content_parts import KEY_ORDER, MEDIA_KEYS, classify
from mmgate.errors import InvalidRequestError

URL = "https://images.example/cat.png"
AV = "https://media.example/clip.mp4"
PARAM = "messages[0].content[0]"


def parse(part: Any) -> Any:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [part]}]})
    return parse_chat_request(raw, max_images=8, max_uuid_length=256)


# (part, url, uuid): vLLM reads each of these as an image (by type, or by key when a uuid is present).
IMAGES = [
    ({"type": "input_image", "image_url": URL, "detail": "auto"}, URL, None),
    ({"type": "input_image", "image_url": URL, "uuid": "u"}, URL, "u"),
    ({"type": "input_image", "image_url": {"url": URL}, "uuid": "u"}, URL, "u"),
    ({"type": "input_image", "image_url": None, "uuid": "u"}, None, "u"),
    ({"type": "text", "text": "hi", "image_url": {"url": URL}, "uuid": "u"}, URL, "u"),
    ({"type": "text", "image_url": None, "uuid": "u"}, None, "u"),
    ({"type": "video_url", "image_url": URL, "uuid": "u"}, URL, "u"),
    ({"type": 7, "image_url": URL, "uuid": "u"}, URL, "u"),
    ({"image_url": {"url": URL}}, URL, None),
    ({"image_url": URL, "uuid": "u"}, URL, "u"),
    ({"type": "anything", "image_url": None, "uuid": "u"}, None, "u"),
    ({"type": "input_image", "uuid": "u"}, None, "u"),
]


@pytest.mark.parametrize(("part", "url", "uuid"), IMAGES)
def test_every_image_shape_becomes_one_canonical_image_slot(part: dict[str, Any], url: str | None, uuid: str | None) -> None:
    req = parse(part)
    assert [(s.url, s.uuid, s.param) for s in req.slots] == [(url, uuid, PARAM)]
    sent = req.body["messages"][0]["content"][0]
    assert sent is req.slots[0].part and sent["type"] == "image_url"
    assert set(sent) <= {"type", "image_url"}  # nothing of the client's part survives as it came


@pytest.mark.parametrize(
    ("part", "fragment"),
    [
        ({"type": "image_pil", "image_pil": None, "uuid": "victim"}, "image_pil"),
        ({"type": "text", "image_pil": None, "uuid": "victim"}, "image_pil"),
        ({"type": "image_pil", "image_pil": "x"}, "image_pil"),
        ({"image_pil": None, "uuid": "u"}, "image_pil"),
        ({"type": "image_embeds", "image_embeds": None, "uuid": "victim"}, "embeddings"),
        ({"type": "text", "image_embeds": None, "uuid": "victim"}, "embeddings"),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, "embeddings"),
        ({"type": "audio_embeds", "audio_embeds": None, "uuid": "a"}, "embeddings"),
        ({"type": "video_embeds", "video_embeds": {"x": "A"}}, "embeddings"),
        ({"type": "prompt_embeds", "data": "AAAA"}, "embeddings"),
        ({"type": "text", "prompt_embeds": "x", "uuid": "u"}, "embeddings"),
        ({"type": "text", "text": "hi", "uuid": "u"}, "only image parts carry a uuid"),
        ({"type": "tool_reference", "name": "x", "uuid": "u"}, "only image parts carry a uuid"),
        ({"type": "text", "text": "hi", "image_url": {"url": URL}}, "must not carry media keys"),
        ({"type": "refusal", "refusal": "no", "video_url": AV}, "must not carry media keys"),
        ({"type": "image_url", "image_url": {"url": URL}, "video_url": AV}, "one medium per part"),
        ({"type": "input_image", "image_url": URL, "file_id": "f"}, "file_id"),
        ({"type": "image_url", "image_url": {"url": URL, "detail": "ultra"}}, "detail"),
        ({"type": "input_image"}, "neither"),
        ({"type": "file", "file": {"file_data": "x"}}, "unsupported content part type"),
        ({"text": "no type"}, "no 'type'"),
        ({"type": ["image_url"], "image_url": URL}, "must be a string"),
        ({"type": "video_url", "video_url": None}, "needs a URL"),
        ({"type": "audio_url", "audio_url": {"url": 5}}, "needs a URL"),
        ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav;base64,QQ"}}, "format"),
        ({"type": "input_audio", "input_audio": "AA=="}, "'input_audio' must be an object"),
        (5, "object or a string"),
    ],
)
def test_unsupported_media_is_refused_naming_the_part(part: Any, fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(part)
    assert info.value.status == 400 and info.value.param == PARAM
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("part", "kind", "url"),
    [
        ({"type": "video_url", "video_url": {"url": AV}}, "video_url", AV),
        ({"type": "audio_url", "audio_url": {"url": AV}}, "audio_url", AV),
        ({"video_url": {"url": AV}}, "video_url", AV),
        ({"audio_url": AV}, "audio_url", AV),
    ],
)
def test_audio_and_video_urls_are_listed_for_the_url_policy(part: dict[str, Any], kind: str, url: str) -> None:
    req = parse(part)
    assert req.slots == []
    assert [(p.kind, p.url, p.param) for p in req.passthrough] == [(kind, url, PARAM)]
    assert req.body["messages"][0]["content"][0] == {"type": kind, kind: {"url": url}}
    assert req.passthrough[0].part is req.body["messages"][0]["content"][0]


@pytest.mark.parametrize(
    ("part", "kind", "url", "value"),
    [
        ({"type": "audio_url", "audio_url": {"url": AV}, "uuid": "u"}, "audio_url", AV, {"url": AV}),
        ({"type": "audio_url", "audio_url": None, "uuid": "u"}, "audio_url", None, None),
        ({"input_audio": {"data": "AA==", "format": "wav"}, "uuid": "u"}, "input_audio", "data:audio/wav;base64,AA==",
         {"data": "AA==", "format": "wav"}),
        ({"type": "input_audio", "input_audio": None, "uuid": "u"}, "input_audio", None, None),
    ],
)
def test_audio_with_a_uuid_is_labelled_or_a_reference(part: dict[str, Any], kind: str, url: str | None,
                                                      value: Any) -> None:
    req = parse(part)
    assert [(p.kind, p.url, p.uuid) for p in req.passthrough] == [(kind, url, "u")]
    assert req.body["messages"][0]["content"][0] == {"type": kind, kind: value}


@pytest.mark.parametrize(
    "part",
    [
        "plain string part",
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
        {"type": "input_text", "text": "hi"},
        {"type": "thinking", "thinking": "hmm"},
        {"type": "tool_reference", "name": "search"},
    ],
)
def test_text_parts_vllm_reads_as_text_are_forwarded_as_they_came(part: Any) -> None:
    req = parse(part)
    assert req.slots == [] and req.passthrough == []
    assert req.body["messages"][0]["content"][0] == part


def test_a_tool_reference_read_by_its_key_is_forwarded_without_the_uuid() -> None:
    """vLLM reads it as the tool reference and ignores the uuid (200): the gateway forwards the same
    reference, without a uuid it would have to police."""
    req = parse({"type": "text", "tool_reference": "x", "name": "search", "uuid": "someone-elses"})
    assert req.body["messages"][0]["content"][0] == {"type": "tool_reference", "name": "search"}


@pytest.mark.parametrize(
    ("part", "url"),
    [
        ({"type": "video_url", "video_url": {"url": AV}, "uuid": "v1"}, AV),
        ({"type": "text", "video_url": AV, "uuid": "v1"}, AV),
        ({"type": "video_url", "video_url": None, "uuid": "v1"}, None),
        ({"type": "video_url", "video_url": {}, "uuid": "v1"}, None),
        ({"type": "video_url", "video_url": {"url": ""}, "uuid": "v1"}, None),
    ],
)
def test_a_video_with_a_uuid_is_labelled_or_a_cache_only_reference(part: dict[str, Any], url: str | None) -> None:
    req = parse(part)
    [slot] = req.passthrough
    assert (slot.kind, slot.url, slot.uuid) == ("video_url", url, "v1")
    assert req.body["messages"][0]["content"][0] == {"type": "video_url",
                                                      "video_url": {"url": url} if url else None}


def test_classify_mirrors_vllm_key_order() -> None:
    # With a uuid, the first key in vLLM's order wins, whatever the type says.
    part = {"type": "video_url", "video_url": AV, "image_url": URL, "uuid": "u"}
    assert classify(part) == "image_url"
    assert classify({"type": "image_url", "image_url": URL}) == "image_url"
    assert KEY_ORDER[0] == "image_url" and "tool_reference" not in MEDIA_KEYS


def test_deep_nesting_is_a_400_not_a_500() -> None:
    deep: Any = "x"
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = {"k": deep}
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "zzz": deep})
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request(raw, max_images=1, max_uuid_length=8)
    assert "deeper than" in info.value.message
