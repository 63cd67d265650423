"""Request bodies to and from JSON without stalling the event loop on very large ones.

orjson parses and writes while holding the GIL, so a body of many data-URL images, parsed in one
go, holds every other request for as long as that takes (docs/PERFORMANCE.md, "One very large
body"); a thread does not help (the GIL) and a process costs as much in copying. What makes such a body large is a few big strings (the images),
so both directions cut them out:

* ``loads_body``: each big image string token (a ``"data:…"`` URL, or the base64 ``"data"`` of
  an Anthropic image source) is found in the raw bytes and replaced by a short placeholder; the small rest is parsed in one go, and each big string on its own (printable
  ASCII without escapes, which a base64 data URL is, read as the text it is; any other by orjson:
  the same validation, the same value), with the loop given back between them.
* ``dumps_body``: big strings are swapped for placeholders in a copy of the containers, the small
  rest is written in one go, and each big string is written on its own and spliced back in.

A caller that holds texts a body may repeat (the images an agent resends every turn) passes
``held`` (``HeldText``): each big string token is offered to it, and a candidate it returns that
is the token's very bytes is the token's value, without a new string decoded (the caller's
confirmation of it is then an identity).

A large body is also bounded in what it parses to: at most ``MAX_CONTAINERS`` JSON objects and
arrays (counted as its opening brackets, outside the big strings: an over-count, strings included).
Parsed, a tiny object costs ~600 bytes where its text took ~27: a 256 MB body of them would parse to
several GB and hold the loop for seconds; past the bound it is a 400 before orjson reads it.

Bodies under ``CUT_LOADS_BYTES`` (parsing) and ``LARGE_BODY_BYTES`` (writing) take plain orjson in
one go (the cut would only cost them; it parses an agent's 700 KB turn of four screenshots in 121 µs
where orjson takes 276). The cut keeps the JSON's
validity: a token is cut only from an unescaped quote that follows ``:``, ``,`` or ``[`` up to the
next unescaped quote, and both it and the placeholder are string tokens whose contents hold no
quote; should the quote in fact close a string, the bare text after it is invalid JSON either way
(``data:`` there, ``@`` in the placeholder), so a body is refused exactly when orjson refuses it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import numpy
import orjson

from mmgate.errors import InvalidRequestError

LARGE_BODY_BYTES = 1 << 20  # smaller bodies are written by plain orjson
CUT_LOADS_BYTES = 256 << 10  # smaller bodies are parsed by plain orjson
BIG_STRING_BYTES = 64 << 10  # strings at least this long are parsed or written on their own
_YIELD_EVERY_BYTES = 4 << 20  # the loop is given back after about this much string work
THREAD_JOIN_BYTES = 4 << 20  # bodies written at least this big are joined in a thread
# Objects and arrays a large body may hold (a long agent session: ~10 a turn); ~80 MB parsed at most.
MAX_CONTAINERS = 1 << 17
_KEY_OR_URL = b'"data'  # a "data:…" string, or a "data" key
_BASE64_START = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_WHITESPACE = b" \t\r\n"

# (raw, start, end) → a str the caller holds that may be the text ``raw[start:end]`` of a big
# string token (its quotes excluded), or None. A candidate must be printable ASCII without ``\\``
# or ``"`` (its bytes are then the token's value exactly); it is used only when it is those bytes.
HeldText = Callable[[bytes | bytearray, int, int], str | None]


def _escaped(raw: bytes | bytearray, quote: int) -> bool:
    """Whether the quote at ``raw[quote]`` is escaped (an odd run of backslashes before it)."""
    i = quote - 1
    while i >= 0 and raw[i] == 0x5C:
        i -= 1
    return (quote - 1 - i) % 2 == 1


def _opens_value(raw: bytes | bytearray, quote: int) -> bool:
    i = quote - 1
    while i >= 0 and raw[i] in _WHITESPACE:
        i -= 1
    return i >= 0 and raw[i] in b":,["


def _value_after_key(raw: bytes | bytearray, key_end: int) -> int:
    """The open quote of the string value after the key whose close quote is at ``key_end``
    (``"data": "…"``) when that value starts like base64 text, else -1."""
    i = key_end + 1
    n = len(raw)
    while i < n and raw[i] in _WHITESPACE:
        i += 1
    if i >= n or raw[i] != 0x3A:  # ':'
        return -1
    i += 1
    while i < n and raw[i] in _WHITESPACE:
        i += 1
    return i if i + 1 < n and raw[i] == 0x22 and raw[i + 1] in _BASE64_START else -1


def _big_strings(raw: bytes | bytearray) -> list[tuple[int, int]]:
    """Spans ``(open quote, close quote)`` of the big string tokens of ``raw`` that hold images:
    those starting ``data:`` (a data URL) and the values of ``"data"`` keys that start like
    base64 text (an Anthropic image source). Either way the token's first character, were its
    quote in fact a closing one, would be bare text no JSON allows after a string (as is the
    placeholder's ``@``)."""
    spans = []
    pos = 0
    while (found := raw.find(_KEY_OR_URL, pos)) >= 0:
        after = raw[found + len(_KEY_OR_URL) : found + len(_KEY_OR_URL) + 1]
        if after == b":":
            start = found
        elif after == b'"' and not _escaped(raw, found):
            start = _value_after_key(raw, found + len(_KEY_OR_URL))
        else:
            start = -1
        if start < 0:
            pos = found + 1
            continue
        end = raw.find(b'"', start + 1)
        while end >= 0 and _escaped(raw, end):
            end = raw.find(b'"', end + 1)
        if end < 0:
            break  # unterminated: orjson will say so
        if end - start >= BIG_STRING_BYTES and not _escaped(raw, start) and _opens_value(raw, start):
            spans.append((start, end))
            pos = end + 1
        else:
            pos = start + 1
    return spans


def check_containers(text: bytes | bytearray) -> None:
    """400 when ``text`` may hold more than ``MAX_CONTAINERS`` objects and arrays (module docstring)."""
    if text.count(b"{") + text.count(b"[") > MAX_CONTAINERS:
        raise InvalidRequestError(f"the request body holds more than {MAX_CONTAINERS} JSON objects and arrays")


def loads_bounded(raw: bytes | bytearray) -> Any:
    """``orjson.loads(raw)``, a large body bounded by ``check_containers`` first."""
    if len(raw) >= CUT_LOADS_BYTES:
        check_containers(raw)
    return orjson.loads(raw)


async def loads_body(raw: bytes | bytearray, held: HeldText | None = None) -> Any:
    """``orjson.loads(raw)``, giving the loop back between the big strings of a large body, which
    ``check_containers`` bounds (outside its big strings). Raises ``orjson.JSONDecodeError`` exactly
    where orjson would, ``InvalidRequestError`` past the bound. ``held``: the module docstring."""
    return (await loads_sized(raw, held))[0]


async def loads_sized(raw: bytes | bytearray, held: HeldText | None = None) -> tuple[Any, int]:
    """``loads_body``, and the bytes of ``raw`` outside its big strings: what a walk of the value
    costs grows with (an agent's turn: ~1 KB of its 800)."""
    if len(raw) < CUT_LOADS_BYTES:
        return orjson.loads(raw), len(raw)
    spans = _big_strings(raw)
    if not spans:
        return loads_bounded(raw), len(raw)
    nonce = secrets.token_hex(8)
    pieces: list[bytes | bytearray] = []
    pos = 0
    for i, (start, end) in enumerate(spans):
        pieces.append(raw[pos:start])
        pieces.append(f'"@mmgate-{nonce}-{i}"'.encode())
        pos = end + 1
    pieces.append(raw[pos:])
    text = b"".join(pieces)
    check_containers(text)
    skeleton = orjson.loads(text)
    view = memoryview(raw)
    values: dict[str, Any] = {}
    done = 0
    for i, (start, end) in enumerate(spans):
        known = None if held is None else _held_text(held, raw, start + 1, end)
        values[f"@mmgate-{nonce}-{i}"] = _string_token(raw, view, start, end) if known is None else known
        done += end - start
        if done >= _YIELD_EVERY_BYTES:
            done = 0
            await asyncio.sleep(0)
    return _restore(skeleton, values), len(text)


def _held_text(held: HeldText, raw: bytes | bytearray, start: int, end: int) -> str | None:
    """``held``'s candidate for the token text ``raw[start:end]`` when it is exactly those bytes."""
    text = held(raw, start, end)
    if text is None or len(text) != end - start or not text.isascii():
        return None
    return text if raw.startswith(text.encode("ascii"), start) else None


def _string_token(raw: bytes | bytearray, view: memoryview, start: int, end: int) -> Any:
    """The value of the string token ``raw[start:end + 1]`` (its quotes included), as orjson gives
    it. A token of printable ASCII without a backslash (a base64 data URL) is its own text: it is
    decoded as such, several times faster than orjson parses it; any other token goes to orjson,
    which validates escapes, control characters and UTF-8."""
    inner = view[start + 1 : end]
    # As signed bytes, one minimum checks both bounds: 0x80 and up read as negative.
    if raw.find(b"\\", start, end) < 0 and len(inner) and int(numpy.frombuffer(inner, numpy.int8).min()) >= 0x20:
        return str(inner, "ascii")
    return orjson.loads(view[start : end + 1])


def _restore(node: Any, values: dict[str, Any]) -> Any:
    """``node`` with each placeholder string (as a value or a key) replaced by its value."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not values.keys().isdisjoint(item):
                renamed = {values.get(k, k): v for k, v in item.items()}
                item.clear()
                item.update(renamed)
            for k, v in item.items():
                if isinstance(v, str):
                    if v in values:
                        item[k] = values[v]
                elif isinstance(v, dict | list):
                    stack.append(v)
        elif isinstance(item, list):
            for j, v in enumerate(item):
                if isinstance(v, str):
                    if v in values:
                        item[j] = values[v]
                elif isinstance(v, dict | list):
                    stack.append(v)
    return values.get(node, node) if isinstance(node, str) else node


async def dumps_body(body: Any) -> bytes:
    """``orjson.dumps(body)``, writing the big strings of a large body one at a time (a caller
    that knows its body is far below ``LARGE_BODY_BYTES`` calls ``orjson.dumps`` itself)."""
    if _big_string_bytes(body) < LARGE_BODY_BYTES:
        return orjson.dumps(body)  # the common body: no copy of its containers, no nonce
    big: list[str] = []
    nonce = secrets.token_hex(8)
    skeleton = _cut(body, big, nonce)
    head = orjson.dumps(skeleton)
    markers = [f'"@mmgate-{nonce}-{i}"'.encode() for i in range(len(big))]
    # Each marker is written once (the nonce is new); in the order of the text, whatever the walk's.
    order = sorted(range(len(big)), key=lambda i: head.index(markers[i]))
    pieces: list[bytes] = []
    pos = 0
    done = 0
    for i in order:
        at = head.index(markers[i], pos)
        pieces.append(head[pos:at])
        pieces.append(orjson.dumps(big[i]))
        pos = at + len(markers[i])
        done += len(big[i])
        if done >= _YIELD_EVERY_BYTES:
            done = 0
            await asyncio.sleep(0)
    pieces.append(head[pos:])
    if sum(map(len, pieces)) < THREAD_JOIN_BYTES:
        # A join of a few MiB holds the loop for well under a millisecond; the hop to a thread
        # and back costs more than that, in latency and in CPU.
        return b"".join(pieces)
    return await asyncio.to_thread(b"".join, pieces)  # bytes.join drops the GIL for large joins


def _big_string_bytes(node: Any) -> int:
    """The length of ``node``'s big strings together (those ``_cut`` would cut out)."""
    total = 0
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) >= BIG_STRING_BYTES:
                total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _cut(node: Any, big: list[str], nonce: str) -> Any:
    """A copy of ``node``'s containers with each big string value replaced by a placeholder (in
    the order ``orjson.dumps`` writes them: depth first, keys in order)."""
    if isinstance(node, str):
        if len(node) >= BIG_STRING_BYTES:
            big.append(node)
            return f"@mmgate-{nonce}-{len(big) - 1}"
        return node
    if isinstance(node, dict):
        return {k: _cut(v, big, nonce) for k, v in node.items()}
    if isinstance(node, list):
        return [_cut(v, big, nonce) for v in node]
    return node
