"""The parse finds an agent's repeated screenshots among the images the gateway holds
(``MediaLoader.held_images`` → ``mmgate.jsonbody``): a token that is a held image's URL, byte for
byte, parses to the held string itself (an Anthropic source's payload: to a copy of its tail, and
its data URL is then the held one); anything else (another tenant's or session's image, a text
that only shares the fingerprint's sample) parses as orjson parses it."""

from __future__ import annotations

import random

import orjson
import pytest

from mmgate.anthropic_chat.request import check_messages_body, source_url, to_chat_body
from mmgate.jsonbody import CUT_LOADS_BYTES, loads_body
from mmgate.media.repeats import fingerprint, span_fingerprint
from tests.media.conftest import LoaderFactory
from tests.support.images import data_url, make_image

# A screenshot-sized PNG of noise: its data URL is a big string (~180 KB) of the body.
_PNG = make_image("PNG", 300, 200, seed=11, noise=1.0)


def _turn(*urls: str) -> bytes:
    """A chat body holding ``urls``, padded past the size from which big strings are cut out."""
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}], "pad": "x" * CUT_LOADS_BYTES}
    return orjson.dumps(body)


def _url_in(body: dict[str, object]) -> object:
    return body["messages"][0]["content"][0]["image_url"]["url"]  # type: ignore[index]


@pytest.mark.parametrize("n", [1, 100, 4096, 8191, 8192, 8193, 70_000, 300_001])
def test_the_fingerprint_of_a_span_is_that_of_its_text(n: int) -> None:
    text = "".join(random.Random(n).choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef+/", k=n))
    raw = bytearray(b'{"u": "' + text.encode() + b'"}')
    assert span_fingerprint(raw, 7, 7 + n) == fingerprint(text)
    assert span_fingerprint(raw, 7, 6 + n) != fingerprint(text)


async def test_a_held_image_is_the_parsed_value(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    url = data_url(_PNG)
    image = await loader.load(url)
    assert image.data_url() is url  # the client's canonical URL is the one kept and forwarded
    again = "".join(["data:", url[5:]])  # the same text, another object (as the next turn's is)
    raw = _turn(again)
    body = await loads_body(raw, loader.held_images(None, None))
    assert _url_in(body) is url
    assert body == orjson.loads(raw)
    assert await loader.load(again) is image


async def test_only_the_requests_own_key_space_is_offered(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    url = data_url(_PNG)
    await loader.load(url, tenant_tag="a")
    raw = _turn(url)
    start = raw.index(b"data:")
    end = start + len(url)
    assert loader.held_images(None, "a")(raw, start, end) is url
    assert loader.held_images(None, "b")(raw, start, end) is None
    assert loader.held_images(None, None)(raw, start, end) is None
    scoped = make_loader(cache={"session_scoping": True})
    await scoped.load(url, session_id="s1")
    assert scoped.held_images("s1", None)(raw, start, end) == url
    assert scoped.held_images("s2", None)(raw, start, end) is None
    assert scoped.held_images(None, None)(raw, start, end) is None


async def test_a_text_that_only_shares_the_sample_is_parsed_as_sent(make_loader: LoaderFactory) -> None:
    """One base64 character changed between the fingerprint's samples: the held image is offered
    (same fingerprint) and refused by the byte compare; the value is the client's text."""
    loader = make_loader()
    url = data_url(_PNG)
    await loader.load(url)
    at = url.index(",") + 1 + 4096 + 7  # past the fingerprint's head (of the payload), between two samples
    other = url[:at] + ("A" if url[at] != "A" else "B") + url[at + 1 :]
    assert fingerprint(other) == fingerprint(url)
    raw = _turn(other)
    start = raw.index(b"data:")
    assert loader.held_images(None, None)(raw, start, start + len(other)) is url  # offered…
    body = await loads_body(raw, loader.held_images(None, None))
    assert _url_in(body) == other and body == orjson.loads(raw)  # …and not taken


async def test_a_non_canonical_url_is_not_the_one_kept(make_loader: LoaderFactory) -> None:
    """A type spelled otherwise: the image forwards the URL the gateway writes, not the client's."""
    loader = make_loader()
    url = data_url(_PNG)
    image = await loader.load("data:IMAGE/PNG;base64," + url.split(",", 1)[1])
    assert image.data_url() == url


def _messages_turn(payload: str, media_type: str = "image/png") -> bytes:
    """An Anthropic Messages body holding one base64 image source, padded as ``_turn``'s."""
    source = {"type": "base64", "media_type": media_type, "data": payload}
    body = {"model": "m", "max_tokens": 4, "pad": "x" * CUT_LOADS_BYTES,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]}
    return orjson.dumps(body)


def _source_in(body: dict[str, object]) -> dict[str, object]:
    return body["messages"][0]["content"][0]["source"]  # type: ignore[index,no-any-return]


def test_a_payload_has_the_fingerprint_of_its_data_url() -> None:
    url = data_url(_PNG)
    payload = url.split(",", 1)[1]
    raw = _messages_turn(payload)
    start = raw.index(payload.encode())
    assert span_fingerprint(raw, start, start + len(payload)) == fingerprint(url) == fingerprint(payload)
    assert fingerprint("data:image/jpeg;base64," + payload) == fingerprint(url)  # the type is confirmed after


async def test_a_held_images_payload_is_the_parsed_value_and_its_url_the_held_one(make_loader: LoaderFactory) -> None:
    """An Anthropic source's ``data`` that is a held image's payload parses to the held text, and
    the source's data URL is the held URL itself, never built: vLLM's text of it, found for free."""
    loader = make_loader()
    url = data_url(_PNG)
    await loader.load(url)
    payload = url.split(",", 1)[1]
    raw = _messages_turn("".join([payload[:1], payload[1:]]))
    held = loader.held_images(None, None)
    body = await loads_body(raw, held)
    assert body == orjson.loads(raw)
    source = _source_in(body)
    assert source_url(source, held.data_url) is url
    chat, _ = to_chat_body(check_messages_body(body), held=held.data_url)
    assert chat["messages"][0]["content"][0]["image_url"]["url"] is url
    assert source_url({**source, "media_type": "image/jpeg"}, held.data_url) == "data:image/jpeg;base64," + payload
    assert held.data_url("image/png", "".join([payload[:1], payload[1:]])) is None  # only what it gave out
    assert loader.held_images(None, None).data_url("image/png", source["data"]) is None  # another request's


async def test_a_payload_that_only_shares_the_sample_is_parsed_as_sent(make_loader: LoaderFactory) -> None:
    loader = make_loader()
    url = data_url(_PNG)
    await loader.load(url)
    payload = url.split(",", 1)[1]
    at = 4096 + 7
    other = payload[:at] + ("A" if payload[at] != "A" else "B") + payload[at + 1 :]
    raw = _messages_turn(other)
    start = raw.index(b'"data":"') + len(b'"data":"')
    held = loader.held_images(None, None)
    assert held(raw, start, start + len(other)) == payload  # offered…
    body = await loads_body(raw, held)
    source = _source_in(body)
    assert source["data"] == other and body == orjson.loads(raw)  # …and not taken
    assert source_url(source, held.data_url) == "data:image/png;base64," + other
    assert loader.held_images(None, "t")(raw, start, start + len(other)) is None  # another tenant's space
