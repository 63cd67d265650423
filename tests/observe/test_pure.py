"""The pure parts of operability: request ids, trace context, usage scanning, logfmt lines."""

from __future__ import annotations

import orjson

from mmgate.observe.access import FIELD_NAMES, MAX_VALUE_CHARS, clip, json_text, json_values_line, logfmt_line
from mmgate.observe.ids import MAX_REQUEST_ID_LENGTH, request_id, valid_traceparent
from mmgate.observe.usage import token_usage


def test_request_ids_are_kept_when_safe_and_made_otherwise() -> None:
    for kept in ("abc", "req-1.2:3/4+5=6@7_8", "x" * MAX_REQUEST_ID_LENGTH):
        assert request_id(kept) == kept
    made = {request_id(bad) for bad in (None, "", "x" * (MAX_REQUEST_ID_LENGTH + 1), "a b", 'q"', "é", "a\tb")}
    assert len(made) == 7 and all(len(m) == 32 and int(m, 16) >= 0 for m in made)


def test_only_well_formed_traceparents_pass() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert valid_traceparent(good) == good
    for bad in (None, good.upper(), good + "-x", "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", "ff" + good[2:], good.replace("-", "_")):
        assert valid_traceparent(bad) is None


def test_usage_is_read_from_whole_answers_and_stream_chunks() -> None:
    whole = orjson.dumps({"id": "x", "choices": [{"message": {"content": '"usage": "prompt_tokens": 99'}}],
                          "usage": {"prompt_tokens": 12, "total_tokens": 19, "completion_tokens": 7,
                                    "prompt_tokens_details": None}})
    assert token_usage(whole) == (12, 7)
    chunk = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    assert token_usage(chunk) == (5, 3)
    assert token_usage(b'{"usage":{"input_tokens":4,"output_tokens":2}}') == (4, 2)  # Responses, Messages
    assert token_usage(b'{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}') == (8, 0)  # embeddings
    for none in (None, b"", b'{"usage":null}', b'{"choices":[]}'):
        assert token_usage(none) is None


def test_a_request_line_quotes_and_escapes_what_would_break_it() -> None:
    plain = ("0" * 32, "POST", "/v1/chat/completions", 200, None, None, "m", "vllm-0", 0, 0, 0, 0, 150, 1200, None,
             None, 0.53, 0.96)
    hostile = ("a=b", "GET", '/x y"\n', 499, "t", "s s", "", None, 1, 2, 3, 4, 5, 6, 7, 8, None, 1.25)
    assert logfmt_line(plain) == (
        f"request_id={'0' * 32} method=POST path=/v1/chat/completions status=200 tenant=- session=- model=m "
        "backend=vllm-0 sent=0 stripped=0 referenced=0 healed=0 bytes_in=150 bytes_out=1200 prompt_tokens=- "
        "completion_tokens=- ttfb_ms=0.5 total_ms=1.0")
    assert logfmt_line(hostile) == (
        'request_id="a=b" method=GET path="/x y\\"\\n" status=499 tenant=t session="s s" model="" backend=- '
        "sent=1 stripped=2 referenced=3 healed=4 bytes_in=5 bytes_out=6 prompt_tokens=7 completion_tokens=8 "
        "ttfb_ms=- total_ms=1.2")
    for values in (plain, hostile):
        assert "\n" not in logfmt_line(values)
        assert orjson.loads(json_values_line(values)) == dict(zip(FIELD_NAMES, values, strict=True))
    assert clip("x" * (MAX_VALUE_CHARS + 5)) == "x" * MAX_VALUE_CHARS + "…" and clip("short") == "short"


def test_a_value_is_one_printable_line_in_both_formats() -> None:
    """Bytes that were not UTF-8 (lone surrogates from ``surrogateescape``), line and paragraph
    separators, C0/C1 controls, DEL and a tag character: escaped, so nothing splits the line."""
    hostile = "a\udcff\udcfe\u2028b\u2029\x85\x7f\x01\x1b[31m\U000e0001\u202e é"
    readable = "a\\xff\\xfe\u2028b\u2029\x85\x7f\x01\x1b[31m\U000e0001\u202e é"  # what a JSON reader gets
    assert json_text(hostile).isprintable() and orjson.loads(json_text(hostile)) == readable
    values = ("id", "GET", hostile, 400, None, hostile, hostile, None, 0, 0, 0, 0, 0, 0, None, None, None, 1.0)
    for line in (logfmt_line(values), json_values_line(values)):
        assert line.isprintable() and len(line.splitlines()) == 1
        line.encode()  # UTF-8, strictly
    assert orjson.loads(json_values_line(values))["session"] == readable
    assert json_text("plain") == '"plain"'
