"""``mmgate.jsonbody``: a large body parsed or written in pieces gives exactly what orjson gives
(the same value, the same refusals), whatever the body hides around its big strings."""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson
import pytest

from mmgate.errors import InvalidRequestError
from mmgate.jsonbody import (
    BIG_STRING_BYTES,
    CUT_LOADS_BYTES,
    LARGE_BODY_BYTES,
    MAX_CONTAINERS,
    THREAD_JOIN_BYTES,
    _big_strings,
    dumps_body,
    loads_body,
    loads_bounded,
)


def data_url(n: int, seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(random.Random(seed).randbytes(n)).decode()


def big_body() -> dict[str, Any]:
    urls = [data_url(300_000, i) for i in range(6)]
    return {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": 'a "data:quoted" text, \\"data:x\\" and ' + "é" * 10},
        *({"type": "image_url", "image_url": {"url": u}} for u in urls[:4]),
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": urls[1].split(",")[1]}},
        {"type": "text", "data": "short", "x": {"data": "(not base64) " + "é" * 40_000}}]}],
        "list": [urls[4], 1, None, True, [urls[5]]], urls[0][:BIG_STRING_BYTES + 10]: "a big key"}


async def test_a_large_body_parses_to_what_orjson_gives() -> None:
    raw = orjson.dumps(big_body())
    assert len(raw) > LARGE_BODY_BYTES
    assert await loads_body(raw) == orjson.loads(raw)
    # The same with whitespace and escaped slashes inside a big string (other writers do that).
    spaced = raw.replace(b'":"', b'" :\n "').replace(b'","', b'" , "')
    escaped = spaced.replace(b"/", b"\\/", 50)
    for variant in (spaced, escaped):
        assert await loads_body(variant) == orjson.loads(variant)


async def test_an_agent_sized_body_is_cut_and_parses_to_what_orjson_gives() -> None:
    """Between ``CUT_LOADS_BYTES`` and ``LARGE_BODY_BYTES`` (an agent's turn of screenshots): the
    cut parses it, to the same value."""
    body = big_body()
    body["messages"][0]["content"] = body["messages"][0]["content"][:2]
    del body["list"]
    raw = orjson.dumps(body)
    assert CUT_LOADS_BYTES <= len(raw) < LARGE_BODY_BYTES
    assert await loads_body(raw) == orjson.loads(raw)
    assert await loads_body(raw.replace(b"/", b"\\/", 20)) == orjson.loads(raw.replace(b"/", b"\\/", 20))


async def test_an_anthropic_image_source_is_cut_out() -> None:
    """The base64 ``data`` of a Messages image source is parsed as text on its own, to the value
    orjson gives; a ``data`` key whose value is not base64-like text is left to orjson."""
    body = big_body()
    raw = orjson.dumps(body)
    spans = _big_strings(raw)
    values = [raw[a + 1:b] for a, b in spans]
    assert body["messages"][0]["content"][5]["source"]["data"].encode() in values
    assert not any(v.startswith(b"(not base64)") for v in values)
    assert await loads_body(raw) == body


async def test_a_large_body_is_written_as_orjson_writes_it() -> None:
    body = big_body()
    assert await dumps_body(body) == orjson.dumps(body)
    small = {"model": "m", "x": "data:" + "A" * 100}
    assert await dumps_body(small) == orjson.dumps(small)
    # Big enough to be joined in a thread, and small bodies of big strings joined on the loop.
    huge = {"model": "m", "images": [data_url(1_000_000, i) for i in range(5)], "n": 1}
    assert len(orjson.dumps(huge)) > THREAD_JOIN_BYTES
    assert await dumps_body(huge) == orjson.dumps(huge)
    one = {"model": "m", "x": [data_url(1_000_000, 9)], "y": "é"}
    assert LARGE_BODY_BYTES < len(orjson.dumps(one)) < THREAD_JOIN_BYTES
    assert await dumps_body(one) == orjson.dumps(one)


async def test_broken_large_bodies_are_refused_exactly_when_orjson_refuses_them() -> None:
    raw = orjson.dumps(big_body())
    rng = random.Random(7)
    # Break it near the big strings' quotes and elsewhere: delete, insert or swap one byte.
    quotes = [i for i in range(len(raw)) if raw[i:i + 6] == b'"data:']
    keys = [i for i in range(len(raw)) if raw[i:i + 6] == b'"data"']
    quotes += [raw.index(b'"', q + 1) for q in quotes] + keys + [raw.index(b'"', k + 6) for k in keys]
    spots = [p + d for p in quotes for d in (-2, -1, 0, 1)] + [rng.randrange(len(raw)) for _ in range(40)]
    for spot in spots:
        for change in (b"", b'"', b"\\", b",", b" ", b"x", b"]"):
            mutated = raw[:spot] + change + raw[spot + (1 if change != b" " else 0):]
            try:
                expected: Any = orjson.loads(mutated)
            except orjson.JSONDecodeError:
                expected = orjson.JSONDecodeError
            try:
                got: Any = await loads_body(mutated)
            except orjson.JSONDecodeError:
                got = orjson.JSONDecodeError
            assert got == expected, (spot, change)


@pytest.mark.parametrize("raw", [b'{"a": 1}', b"[1, 2]", b'"data:x"'])
async def test_small_bodies_take_plain_orjson(raw: bytes) -> None:
    assert await loads_body(raw) == orjson.loads(raw)


@pytest.mark.parametrize("inside", [b"\x01", b"\x1f", b"\t", b"\n", b"\xff", b"\xc3", b"\xed\xa0\x80"])
async def test_a_big_string_with_a_raw_control_byte_or_bad_utf8_is_refused_as_orjson_refuses_it(inside: bytes) -> None:
    raw = orjson.dumps({"a": [data_url(900_000, 1)], "b": 1})
    at = raw.index(b"base64,") + 5000
    mutated = raw[:at] + inside + raw[at:]
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(mutated)
    with pytest.raises(orjson.JSONDecodeError):
        await loads_body(mutated)


@pytest.mark.parametrize("inside", [b"\x7f", b" ", "\u00e9".encode(), "\u2603".encode(), b"\\u0041", b"\\n", b"\\\\"])
async def test_a_big_string_reads_as_orjson_reads_it_whatever_it_holds(inside: bytes) -> None:
    raw = orjson.dumps({"a": [data_url(900_000, 2)], "b": 1})
    at = raw.index(b"base64,") + 5000
    mutated = raw[:at] + inside + raw[at:]
    expected = orjson.loads(mutated)
    assert await loads_body(mutated) == expected


def tiny_objects(n: int, *, image: bool) -> bytes:
    """A chat body of ``n`` one-letter text parts (and one large image, cut out before parsing)."""
    parts: list[Any] = [{"type": "text", "text": "a"} for _ in range(n)]
    if image:
        parts.append({"type": "image_url", "image_url": {"url": data_url(BIG_STRING_BYTES * 4, 7)}})
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]})


@pytest.mark.parametrize("image", [False, True])
async def test_a_large_body_of_too_many_objects_is_refused_before_it_is_parsed(image: bool) -> None:
    """Each tiny object parses to ~600 bytes: past ``MAX_CONTAINERS`` a large body is a 400, on the
    async path (its big strings cut out) and the plain one; one under the bound parses as orjson does."""
    over = tiny_objects(MAX_CONTAINERS, image=image)  # + the body's own object, list and message
    assert len(over) >= CUT_LOADS_BYTES
    with pytest.raises(InvalidRequestError, match=f"more than {MAX_CONTAINERS} JSON objects"):
        await loads_body(over)
    with pytest.raises(InvalidRequestError, match="JSON objects and arrays"):
        loads_bounded(over)
    under = tiny_objects(MAX_CONTAINERS - 6, image=image)
    assert await loads_body(under) == loads_bounded(under) == orjson.loads(under)


async def test_brackets_inside_the_big_strings_are_not_counted() -> None:
    """An image's base64 holds none, but a big text string cut out like one may: only the skeleton
    the bound protects is counted."""
    text = "data:" + "{" * (MAX_CONTAINERS + 10) + "x" * BIG_STRING_BYTES
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    assert (await loads_body(body))["messages"][0]["content"] == text


async def test_a_held_text_is_taken_only_when_it_is_the_tokens_bytes() -> None:
    """``held``: a candidate equal to the token's bytes is the value itself (no new string);
    one of another length, other bytes or not ASCII is ignored, and the value is orjson's."""
    url = data_url(300_000, 1)
    raw = orjson.dumps({"messages": [{"url": url}, {"url": url}], "pad": "x" * CUT_LOADS_BYTES})
    twin = "".join(["data:", url[5:]])
    offered: list[tuple[int, int]] = []

    def held(candidate: str) -> Any:
        def lookup(body: bytes | bytearray, start: int, end: int) -> str:
            offered.append((start, end))
            return candidate
        return lookup

    body = await loads_body(raw, held(twin))
    assert [m["url"] for m in body["messages"]] == [url, url]
    assert all(m["url"] is twin for m in body["messages"])
    assert [raw[s:e].decode() for s, e in offered] == [url, url]
    for wrong in (twin[:-1], twin[:-5] + "AAAAA" if not twin.endswith("AAAAA") else twin[:-5] + "BBBBB",
                  twin[:-1] + "é"):
        body = await loads_body(raw, held(wrong))
        assert body == orjson.loads(raw) and all(m["url"] is not wrong for m in body["messages"])
