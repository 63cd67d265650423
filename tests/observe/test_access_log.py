"""The access log, request ids and per-tenant metrics, as an operator sees them: a real gateway
with API keys in front of real sim engines (behind a recording proxy, to see what reached the
backend), its stderr lines parsed and its /metrics page scraped."""

from __future__ import annotations

import base64
import re
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from mmgate.config import BackendSpec
from tests.support.gateway import gateway_settings, running_gateway, running_sims
from tests.support.images import png_data_url
from tests.support.recorder import recording_proxy
from tests.support.serve_process import serve_process

KEY = "sk-tenant-a-0123456789"
MODEL = "mmgate-sim-vl"
SECRET = "tenant-secret-0123456789abcdef"
BACKEND_KEY = "bk-replica-0123456789"
HEX32 = re.compile(r"[0-9a-f]{32}")


def chat(image: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, **extra, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": image}}]}]}


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, bytes, CIMultiDict[str]]:
    data = None if body is None else orjson.dumps(body)
    async with session.request(method, url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
        return r.status, await r.read(), CIMultiDict(r.headers)


def metric(page: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in page.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} not on the page")


async def test_every_route_logs_one_json_line_with_its_request_id(tmp_path: Path, access_lines: list[str]) -> None:
    keys, backend_keys = tmp_path / "keys.txt", tmp_path / "backend-keys.txt"
    keys.write_text(f"{KEY} tenant-a\n")
    backend_keys.write_text(f"replica-0 {BACKEND_KEY}\n")
    admin = tmp_path / "admin.key"  # /metrics answers only the admin key once API keys are set
    admin.write_text("admin-key-0123456789abcdef")
    image = png_data_url(seed=7, width=96)
    auth = {"Authorization": f"Bearer {KEY}", "X-Session-Id": "conv 1 \"quoted\""}
    async with running_sims(1) as sims, recording_proxy(sims[0].url) as proxy:
        settings = gateway_settings(backends=(BackendSpec(kind="vllm", url=proxy.url, name="replica-0"),),
                                    api_keys_file=str(keys), access_log="json", tenant_secret=SECRET,
                                    backend_keys_file=str(backend_keys), admin_key_file=str(admin))
        async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
            body = chat(image)
            raw = orjson.dumps(body)
            status, answer, headers = await call(s, "POST", gw.url + "/v1/chat/completions", body,
                                                 {**auth, "X-Request-Id": "client-req-1"})
            assert status == 200, answer
            assert headers["X-Request-Id"] == "client-req-1"
            assert CIMultiDict(proxy.headers[-1])["X-Request-Id"] == "client-req-1"  # vLLM builds its id from it
            # The second turn sends the same image again: the gateway strips it to a reference.
            status, _, headers = await call(s, "POST", gw.url + "/v1/chat/completions",
                                            chat(image, stream=True, stream_options={"include_usage": True}), auth)
            assert status == 200
            made = headers["X-Request-Id"]
            assert HEX32.fullmatch(made) and CIMultiDict(proxy.headers[-1])["X-Request-Id"] == made
            # Errors carry a request id too: no key (401), a hostile id (replaced), an unknown path.
            status, _, headers = await call(s, "POST", gw.url + "/v1/chat/completions", body,
                                            {"X-Request-Id": 'bad id "with" quotes'})
            assert status == 401 and HEX32.fullmatch(headers["X-Request-Id"])
            status, _, headers = await call(s, "GET", gw.url + "/no/such/path", None, {**auth, "X-Request-Id": "x" * 129})
            assert status == 404 and HEX32.fullmatch(headers["X-Request-Id"])
            status, _, headers = await call(s, "POST", gw.url + "/v1/completions",
                                            {"model": MODEL, "prompt": "hi", "max_tokens": 3},
                                            {**auth, "X-Request-Id": "cmpl.2"})
            # Forwarded as it came (the sim serves only chat: its own 404 comes back, logged as such).
            assert status == 404 and headers["X-Request-Id"] == "cmpl.2"
            status, _, headers = await call(s, "POST", gw.url + "/v1/messages", {
                "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, auth)
            assert status == 200 and HEX32.fullmatch(headers["X-Request-Id"])
            status, _, headers = await call(s, "POST", gw.url + "/v1/responses", {
                "model": MODEL, "max_output_tokens": 4, "input": "hi"}, {**auth, "X-Request-Id": "resp-3"})
            assert headers["X-Request-Id"] == "resp-3"
            responses_status = status
            _, page, _ = await call(s, "GET", gw.url + "/metrics", None, {"Authorization": "Bearer admin-key-0123456789abcdef"})
    lines = [orjson.loads(line) for line in access_lines]
    by_path = {}
    for line in lines:
        by_path.setdefault(line["path"], []).append(line)
    first, second, refused = by_path["/v1/chat/completions"]
    assert first["request_id"] == "client-req-1" and first["status"] == 200
    assert first["tenant"] == "tenant-a" and first["model"] == MODEL and first["backend"] == "replica-0"
    assert first["session"] == 'conv 1 "quoted"'
    assert (first["sent"], first["stripped"], first["healed"]) == (1, 0, 0)
    assert first["bytes_in"] == len(raw) and len(answer) < first["bytes_out"] < len(answer) + 1024  # its head too
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] > 0
    assert 0 <= first["ttfb_ms"] <= first["total_ms"]
    assert (second["sent"], second["stripped"]) == (0, 1) and second["completion_tokens"] > 0
    assert second["request_id"] == made
    assert refused["status"] == 401 and refused["tenant"] is None
    assert by_path["/no/such/path"][0]["status"] == 404
    (completion_line,) = by_path["/v1/completions"]
    assert (completion_line["request_id"], completion_line["status"]) == ("cmpl.2", 404)
    assert completion_line["model"] == MODEL and completion_line["backend"] == "replica-0"
    assert by_path["/v1/messages"][0]["status"] == 200 and by_path["/v1/messages"][0]["tenant"] == "tenant-a"
    (responses_line,) = by_path["/v1/responses"]
    assert responses_line["request_id"] == "resp-3" and responses_line["status"] == responses_status
    assert responses_line["tenant"] == "tenant-a" and responses_line["model"] == MODEL
    # Per-tenant metrics agree with the log.
    text = page.decode()
    tenant_lines = [line for line in lines if line["tenant"] == "tenant-a"]
    assert metric(text, "mmgate_tenant_requests_total", tenant="tenant-a", status_class="2xx") == sum(
        line["status"] == 200 for line in tenant_lines)
    assert metric(text, "mmgate_tenant_requests_total", tenant="none", status_class="4xx") == 1
    assert metric(text, "mmgate_tenant_images_total", tenant="tenant-a") == 2
    completion = sum(line["completion_tokens"] or 0 for line in tenant_lines)
    assert metric(text, "mmgate_tenant_tokens_total", tenant="tenant-a", kind="completion") == completion > 0
    assert metric(text, "mmgate_tenant_bytes_total", tenant="tenant-a", direction="in") == sum(
        line["bytes_in"] for line in tenant_lines)
    # Never an image, a key or a secret in the log.
    everything = "\n".join(access_lines)
    payload = image.split(",", 1)[1]
    assert CIMultiDict(proxy.headers[0])["Authorization"] == f"Bearer {BACKEND_KEY}"  # it was in play
    for secret in (KEY, SECRET, BACKEND_KEY, payload[:40], base64.b64decode(payload)[:16].hex(), "data:image"):
        assert secret not in everything


async def test_logfmt_lines_stay_one_line_whatever_the_client_sends(access_lines: list[str]) -> None:
    async with running_gateway(gateway_settings()) as gw, aiohttp.ClientSession() as s:
        hostile = {"X-Session-Id": "a b=c\\d \"q\" é", "X-Request-Id": "ok-id"}
        status, _, headers = await call(s, "POST", gw.url + "/v1/chat/completions", chat(png_data_url(seed=1)), hostile)
        assert status == 200 and headers["X-Request-Id"] == "ok-id"
    (line,) = [line for line in access_lines if "ok-id" in line]
    assert "\n" not in line
    fields = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))
    assert fields["request_id"] == "ok-id" and fields["status"] == "200" and fields["sent"] == "1"
    assert orjson.loads(fields["session"]) == "a b=c\\d \"q\" é"
    assert fields["tenant"] == "-" and float(fields["total_ms"]) >= float(fields["ttfb_ms"]) >= 0


async def test_access_log_off_writes_nothing(access_lines: list[str]) -> None:
    async with running_gateway(gateway_settings(access_log="off")) as gw, aiohttp.ClientSession() as s:
        status, _, headers = await call(s, "POST", gw.url + "/v1/chat/completions", chat(png_data_url(seed=2)))
        assert status == 200 and HEX32.fullmatch(headers["X-Request-Id"])  # ids still made
    assert access_lines == []


def test_mmgate_serve_writes_its_lines_to_stderr(tmp_path: Path) -> None:
    """As an operator runs it: ``mmgate serve`` (default ``--log-level info``, default logfmt)
    writes one bare line per request on stderr; ``--log-level warning`` silences them."""
    body = orjson.dumps(chat(png_data_url(seed=4)))
    for flags, expected in (((), 2), (("--log-level", "warning", "--access-log", "json"), 0)):
        with serve_process(tmp_path, *flags) as gw:
            for rid in ("proc-1", "proc-2"):
                request = urllib.request.Request(gw.url + "/v1/chat/completions", data=body, method="POST",
                                                 headers={"Content-Type": "application/json", "X-Request-Id": rid})
                with urllib.request.urlopen(request, timeout=30) as r:
                    assert r.status == 200 and r.headers["X-Request-Id"] == rid
            assert gw.terminate() == 0
            lines = [line for line in gw.log_path.read_text().splitlines() if "request_id=proc-" in line
                     or '"request_id":"proc-' in line]
        assert len(lines) == expected
        for line, rid in zip(lines, ("proc-1", "proc-2"), strict=False):
            assert line.startswith(f"request_id={rid} method=POST path=/v1/chat/completions status=200 ")
