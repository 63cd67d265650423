"""Media on passthrough endpoints: every media field passes the gateway's parser and URL policy
before a backend sees it, and chat-style ``messages`` on ``/v1/embeddings`` and ``/pooling`` run
the chat media pipeline (images loaded, uuids, repeats stripped) posted to that path. Real
gateway, real image origin, echo backends that keep the bodies they received."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.api.test_endpoints import call, fleet
from tests.support.audio import data_url, wav
from tests.support.images import make_image
from tests.support.origin import ImageOrigin

WAV = data_url(wav(0.1))  # a real one: the policed endpoints check a data: audio's container



def conversation(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}]


async def test_embeddings_messages_run_the_chat_pipeline_with_reuse(origin: ImageOrigin) -> None:
    url = origin.add("a.png", make_image("PNG", seed=1))
    async with fleet((("m1",),)) as (gw, (echo,)):
        for path in ("/v1/embeddings", "/pooling"):
            request = {"model": "m1", "messages": conversation({"type": "image_url", "image_url": {"url": url}})}
            for _ in range(2):
                status, body, headers, _ = await call("POST", gw.url + path, body=request)
                assert status == 200 and body["path"] == path and "x-mmgate-reuse" in headers
        sent = [orjson.loads(s.body)["messages"][0]["content"][1] for s in echo.seen]
        assert sent[0]["uuid"] and sent[0]["image_url"]["url"].startswith("data:image/png;base64,")
        # The repeat went as a cache-only reference, on both endpoints (same backend, same image).
        assert all(p["uuid"] == sent[0]["uuid"] and not (p.get("image_url") or {}).get("url") for p in sent[1:])
        assert origin.hits["/img/a.png"] == 1


async def test_embeddings_without_model_name_the_fleets_model(origin: ImageOrigin) -> None:
    url = origin.add("b.png", make_image("PNG", seed=2))
    async with fleet((("m1",),)) as (gw, (echo,)):
        request = {"messages": conversation({"type": "image_url", "image_url": {"url": url}})}
        status, _, _, _ = await call("POST", gw.url + "/v1/embeddings", body=request)
        assert status == 200 and orjson.loads(echo.seen[0].body)["model"] == "m1"


async def test_media_urls_elsewhere_pass_the_url_policy(origin: ImageOrigin) -> None:
    url = origin.add("c.png", make_image("PNG", seed=3))
    async with fleet((("m1",),)) as (gw, (echo,)):
        # /tokenize messages: the URL checked, the part rebuilt, a client uuid dropped.
        request = {"model": "m1", "messages": conversation(
            {"type": "image_url", "image_url": {"url": url}, "uuid": "client-label"},
            {"type": "audio_url", "audio_url": {"url": WAV}})}
        status, _, _, _ = await call("POST", gw.url + "/tokenize", body=request)
        assert status == 200
        parts = orjson.loads(echo.seen[-1].body)["messages"][0]["content"]
        assert parts[1] == {"type": "image_url", "image_url": {"url": url}}
        assert parts[2] == {"type": "audio_url", "audio_url": {"url": WAV}}
        # /score multimodal content, batched embeddings: policed wherever nested.
        for path, body, param in (
            ("/score", {"model": "m1", "data_1": "q", "data_2": {"content": [
                {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}]}},
             "data_2.content[0]"),
            ("/v1/embeddings", {"model": "m1", "messages": [conversation(
                {"type": "image_url", "image_url": {"url": "http://10.9.8.7/x.png"}})]}, "messages[0][0].content[1]"),
            ("/classify", {"model": "m1", "messages": conversation(
                {"type": "video_url", "video_url": {"url": "file:///etc/passwd"}})}, "messages[0].content[1]"),
        ):
            before = len(echo.seen)
            status, answer, _, _ = await call("POST", gw.url + path, body=body)
            assert status == 400 and answer["error"]["param"] == param, (path, answer)
            assert len(echo.seen) == before  # refused before any backend saw it


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"model": "m1", "prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/tokenize", {"model": "m1", "messages": conversation({"type": "image_url", "uuid": "only-a-ref"})},
     "messages[0].content[1]"),
    ("/rerank", {"model": "m1", "query": "q", "documents": [{"content": [{"type": "image_embeds",
                                                                          "image_embeds": "AAAA"}]}]},
     "documents[0].content[0]"),
    ("/tokenize", {"model": "m1", "messages": conversation({"type": "image_pil", "image_pil": None})},
     "messages[0].content[1]"),
    ("/tokenize", {"model": "m1", "messages": conversation({"type": "text", "text": "x", "image_url": "u"})},
     "messages[0].content[1]"),
])
async def test_media_the_gateway_cannot_police_is_refused(path: str, body: dict[str, Any], param: str) -> None:
    async with fleet((("m1",),)) as (gw, (echo,)):
        status, answer, _, _ = await call("POST", gw.url + path, body=body)
        assert status == 400 and answer["error"]["param"] == param, answer
        assert not [s for s in echo.seen if s.method == "POST"]


async def test_escaped_keys_and_schemas() -> None:
    async with fleet((("m1",),)) as (gw, (echo,)):
        # An escaped media key is still found (vLLM reads it as image_url).
        raw = (b'{"model":"m1","messages":[{"role":"user","content":[{"type":"\\u0069mage_url",'
               b'"\\u0069mage_url":{"url":"http://10.1.1.1/a.png"}}]}]}')
        status, answer, _, _ = await call("POST", gw.url + "/tokenize", raw=raw)
        assert status == 400 and answer["error"]["param"] == "messages[0].content[0]"
        # A JSON schema property named image_url is not media: forwarded byte for byte.
        raw = (b'{"model":"m1","prompt":"x","response_format":{"type":"json_schema","json_schema":'
               b'{"name":"s","schema":{"properties":{"image_url":{"type":"string"}}}}}}')
        status, _, _, _ = await call("POST", gw.url + "/v1/completions", raw=raw)
        assert status == 200 and echo.seen[-1].body == raw
