"""The access log against the bytes a client chooses, as an operator reads it: ``mmgate serve``
in a child process, requests sent over raw sockets with bytes no client library would send (not
UTF-8, line and paragraph separators, C1 controls, DEL) in the session header, the path and the
model, on the chat path and on another path. Its stderr, read
back as bytes, must be UTF-8 and hold exactly one line per request, whichever reader splits it."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import orjson
import pytest

from tests.support.serve_process import serve_process

SESSION = "x-session-id"
NOT_UTF8 = b"\xff\xfe"
LINE_SEP = "a\u2028request_id=forged method=GET"
SEPARATORS = "a\x85b\u2029"
MODEL = "m\u2028request_id=forged\x7f\x85"
PATH = "/%E2%80%A8request_id=forged%7F%C2%85%E2%80%A9"


def _exchange(port: int, head: bytes, body: bytes = b"") -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"Connection: close\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def _chat(port: int, rid: str, header: bytes = b"", model: str = "mmgate-sim-vl") -> int:
    body = orjson.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    return _exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n".encode() + header, body)


def _get(port: int, rid: str, target: str = "/v1/models", header: bytes = b"") -> int:
    return _exchange(port, f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Request-Id: {rid}\r\n".encode() + header)


def _fields(line: str, kind: str) -> dict[str, object]:
    if kind == "json":
        return dict(orjson.loads(line))
    pairs = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)
    return {name: orjson.loads(value) if value.startswith('"') else value for name, value in pairs}


@pytest.mark.parametrize("kind", ["logfmt", "json"])
def test_every_request_is_one_escaped_line_whatever_its_bytes(tmp_path: Path, kind: str) -> None:
    # request id → (status, field, the value read back: the client's, a byte that was not UTF-8 as \xNN)
    sent: dict[str, tuple[int, str, str]] = {}
    with serve_process(tmp_path, "--access-log", kind) as gw:
        for n in range(20):  # chat and another path, many times over: none may be lost
            sent[f"lane-bytes-{n}"] = (_chat(gw.port, f"lane-bytes-{n}", SESSION.encode() + b": " + NOT_UTF8
                                             + b"\r\n"), "session", "\\xff\\xfe")
            sent[f"aio-bytes-{n}"] = (_get(gw.port, f"aio-bytes-{n}", header=SESSION.encode() + b": " + NOT_UTF8
                                           + b"\r\n"), "session", "\\xff\\xfe")
        sent["lane-sep"] = (_chat(gw.port, "lane-sep", f"{SESSION}: {LINE_SEP}\r\n".encode()), "session", LINE_SEP)
        sent["lane-c1"] = (_chat(gw.port, "lane-c1", f"{SESSION}: {SEPARATORS}\r\n".encode()), "session", SEPARATORS)
        sent["lane-model"] = (_chat(gw.port, "lane-model", model=MODEL), "model", MODEL)
        sent["aio-path"] = (_get(gw.port, "aio-path", PATH), "path", "/\u2028request_id=forged\x7f\x85\u2029")
        sent["aio-sep"] = (_get(gw.port, "aio-sep", header=f"{SESSION}: {LINE_SEP}\r\n".encode()), "session", LINE_SEP)
        assert gw.terminate() == 0
        data = gw.log_path.read_bytes()
    text = data.decode()  # strict: the log is UTF-8
    assert all(line.isprintable() for line in text.split("\n") if "request_id" in line)  # nothing to split on
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]
    records = [_fields(line, kind) for line in text.splitlines()  # splits on U+2028, U+0085 … too
               if line.startswith(("request_id=", '{"request_id"'))]
    logged = [record["request_id"] for record in records]
    for rid, (status, field, value) in sent.items():
        assert 400 <= status < 500 or status == 200, (rid, status)
        assert logged.count(rid) == 1, (rid, text[-3000:])
        (record,) = [record for record in records if record["request_id"] == rid]
        assert record[field] == value and str(record["status"]) == str(status)
    assert "forged" not in logged


@pytest.mark.parametrize("kind", ["logfmt", "json"])
def test_a_request_the_http_parser_refuses_is_one_line_too(tmp_path: Path, kind: str) -> None:
    """aiohttp's parser answers a header with a control byte (400) before any middleware runs:
    the gateway still writes that request's line, and only one."""
    with serve_process(tmp_path, "--access-log", kind) as gw:
        refused = [_get(gw.port, "never-read", header=b"x-bad: a\x01b\r\n") for _ in range(3)]
        served = _get(gw.port, "served-after")
        assert gw.terminate() == 0
        text = gw.log_path.read_bytes().decode()
    assert refused == [400] * 3 and served == 200
    records = [_fields(line, kind) for line in text.splitlines()
               if line.startswith(("request_id=", '{"request_id"'))]
    assert [str(r["status"]) for r in records].count("400") == 3, text[-3000:]
    assert [r["request_id"] for r in records].count("served-after") == 1
