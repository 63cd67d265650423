"""The differential corpus: every content-part shape vLLM 0.32's chat parser accepts (and some it
refuses), each sent by tenant B after tenant A labelled an image ``victim``, with URLs that point at
a loopback "secret" origin the URL policy refuses, at an allowed origin, or at ``data:``.

``run_corpus`` is backend-agnostic: it sends every case through a gateway whose only backend is a
recording proxy (in front of any OpenAI-compatible server: the sim, or real vLLM), and — when a
direct URL is given — to that backend directly too. It returns one ``Outcome`` per case: the
gateway's answer, what it forwarded, and the direct answer. Placeholders in the parts:
``{secret}`` (a URL the policy refuses), ``{origin}`` (an allowed image URL), ``{png}`` (a data: URL),
``{victim_key}`` (tenant A's backend key for ``victim``), ``{content_key}`` (a content key).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from PIL import Image

from tests.support.api_corpus import API_CASES, UNDECODABLE
from tests.support.gateway import gateway_settings, running_gateway, running_sims, vllm_specs
from tests.support.origin import ImageOrigin
from tests.support.recorder import recording_proxy

MODEL = "mmgate-sim-vl"

PNG_1x1 = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElF"
           "TkSuQmCC")
WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="
# Not a decodable video (an MP4's first box only): what a backend answers for it is its own.
VIDEO = "data:video/mp4;base64,AAAAGGZ0eXBtcDQyAAAAAG1wNDJpc29t"

# (name, part): the part tenant B sends as content[1] of its one user message.
CASES: list[tuple[str, Any]] = [
    ("image_url object, allowed origin", {"type": "image_url", "image_url": {"url": "{origin}"}}),
    ("image_url object, secret URL", {"type": "image_url", "image_url": {"url": "{secret}"}}),
    ("image_url object, data: URL + uuid", {"type": "image_url", "image_url": {"url": "{png}"}, "uuid": "b-1"}),
    ("image_url as a string (by type)", {"type": "image_url", "image_url": "{png}"}),
    ("image_url string + uuid (by key)", {"type": "image_url", "image_url": "{secret}", "uuid": "b-2"}),
    ("image_url null + own uuid victim", {"type": "image_url", "image_url": None, "uuid": "victim"}),
    ("image_url null + A's backend key", {"type": "image_url", "image_url": None, "uuid": "{victim_key}"}),
    ("image_url deprecated nested uuid", {"type": "image_url", "image_url": {"url": "{png}", "uuid": "b-3"}}),
    ("image_url data: + uuid spelling a content key", {"type": "image_url", "image_url": {"url": "{png}"},
                                                       "uuid": "{content_key}"}),
    ("image_url + video_url keys + uuid", {"type": "image_url", "image_url": {"url": "{png}"},
                                           "video_url": {"url": "{secret}"}, "uuid": "b-4"}),
    ("input_image string, secret URL", {"type": "input_image", "image_url": "{secret}", "detail": "auto"}),
    ("input_image string, data: URL", {"type": "input_image", "image_url": "{png}", "detail": "auto"}),
    ("input_image object, secret URL + uuid", {"type": "input_image", "image_url": {"url": "{secret}"}, "uuid": "b-5"}),
    ("input_image null + A's backend key", {"type": "input_image", "image_url": None, "uuid": "{victim_key}"}),
    ("text part with image_url + uuid (by key)", {"type": "text", "text": "x", "image_url": {"url": "{secret}"},
                                                  "uuid": "b-6"}),
    ("text part with image_url null + A's key", {"type": "text", "text": "x", "image_url": None,
                                                 "uuid": "{victim_key}"}),
    ("text part with image_url, no uuid", {"type": "text", "text": "x", "image_url": {"url": "{secret}"}}),
    ("no type, image_url", {"image_url": {"url": "{secret}"}}),
    ("no type, image_url string + uuid", {"image_url": "{png}", "uuid": "b-7"}),
    ("image_pil null + A's backend key", {"type": "image_pil", "image_pil": None, "uuid": "{victim_key}"}),
    ("text part with image_pil null + A's key", {"type": "text", "image_pil": None, "uuid": "{victim_key}"}),
    ("image_pil value, no uuid", {"type": "image_pil", "image_pil": "x"}),
    ("image_embeds null + A's backend key", {"type": "image_embeds", "image_embeds": None, "uuid": "{victim_key}"}),
    ("image_embeds base64, no uuid", {"type": "image_embeds", "image_embeds": "AAAA"}),
    ("audio_embeds null + uuid", {"type": "audio_embeds", "audio_embeds": None, "uuid": "{victim_key}"}),
    ("video_embeds null + uuid", {"type": "video_embeds", "video_embeds": None, "uuid": "{victim_key}"}),
    ("prompt_embeds", {"type": "prompt_embeds", "data": "AAAA"}),
    ("text part with prompt_embeds + uuid (by key)", {"type": "text", "prompt_embeds": "AAAA", "uuid": "b-12"}),
    ("video_url object, secret URL", {"type": "video_url", "video_url": {"url": "{secret}"}}),
    ("video_url object, allowed origin", {"type": "video_url", "video_url": {"url": "{origin}"}}),
    ("video_url string (by type)", {"type": "video_url", "video_url": "{secret}"}),
    ("video_url by key + uuid", {"type": "text", "video_url": "{secret}", "uuid": "b-8"}),
    ("video_url data: + uuid", {"type": "video_url", "video_url": {"url": "{video}"}, "uuid": "b-13"}),
    ("video_url null + A's backend key", {"type": "video_url", "video_url": None, "uuid": "{victim_key}"}),
    ("video_url null + own uuid never sent", {"type": "video_url", "video_url": None, "uuid": "b-14"}),
    ("video_url, metadata address", {"type": "video_url", "video_url": {"url": "http://169.254.169.254/latest/"}}),
    ("video_url, secret as a decimal IP", {"type": "video_url", "video_url": {"url": "{secret_decimal}"}}),
    ("video_url, file: URL", {"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}),
    ("audio_url object, secret URL", {"type": "audio_url", "audio_url": {"url": "{secret}"}}),
    ("audio_url by key, no type", {"audio_url": "{secret}"}),
    ("audio_url + uuid", {"type": "audio_url", "audio_url": {"url": "{origin}"}, "uuid": "b-9"}),
    ("input_audio data", {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}),
    ("input_audio + A's backend key", {"type": "input_audio", "input_audio": None, "uuid": "{victim_key}"}),
    ("text", {"type": "text", "text": "hello"}),
    ("text + uuid", {"type": "text", "text": "hello", "uuid": "b-10"}),
    ("input_text", {"type": "input_text", "text": "hello"}),
    ("refusal", {"type": "refusal", "refusal": "no"}),
    ("thinking", {"type": "thinking", "thinking": "hmm"}),
    ("tool_reference", {"type": "tool_reference", "name": "search"}),
    ("text part with tool_reference + uuid (by key)", {"type": "text", "tool_reference": "x", "name": "search",
                                                       "uuid": "{victim_key}"}),
    ("a plain string part", "hello"),
    ("unknown type", {"type": "file", "file": {"file_data": "AAAA"}}),
    ("no type, no media key", {"text": "x"}),
]


# Cases the gateway refuses on purpose where vLLM acts, by docs/SECURITY.md's reason
# ("Deliberate refusals"); every other case gets vLLM's status class through the gateway.
POLICY_REFUSALS: dict[str, str] = {
    **{name: "url-policy" for name in (
        "image_url object, secret URL", "image_url string + uuid (by key)", "input_image string, secret URL",
        "input_image object, secret URL + uuid", "text part with image_url + uuid (by key)", "no type, image_url",
        "video_url object, secret URL", "video_url by key + uuid", "video_url, metadata address",
        "video_url, secret as a decimal IP", "video_url, file: URL", "audio_url object, secret URL",
        "audio_url by key, no type")},
    **{name: "tenant-uuids" for name in (
        "image_url null + A's backend key", "input_image null + A's backend key",
        "text part with image_url null + A's key", "image_pil null + A's backend key", "video_url null + A's backend key",
        "text part with image_pil null + A's key")},
    "image_url + video_url keys + uuid": "one-medium-per-part",
    "text part with image_url, no uuid": "media-keys-on-text",
    "video_url data: + uuid": "video-container-check",
}


@dataclass
class Outcome:
    """One case: what the gateway answered and forwarded; the direct answer when there was one."""

    name: str
    part: Any
    gateway_status: int
    gateway_error: str | None
    forwarded: list[Any] = field(default_factory=list)  # content parts the backend received
    direct_status: int | None = None
    direct_error: str | None = None


def fill(value: Any, values: dict[str, str]) -> Any:
    text = json.dumps(value)
    for key, replacement in values.items():
        text = text.replace("{" + key + "}", replacement)
    return json.loads(text)


def request(model: str, part: Any, max_tokens: int = 1) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]}


async def _post(session: aiohttp.ClientSession, url: str, body: Any, key: str | None,
                path: str = "/v1/chat/completions") -> tuple[int, str | None]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for attempt in range(2):
        try:
            return await _post_once(session, url + path, body, headers)
        except aiohttp.ClientConnectionError as exc:  # a keep-alive connection the server closed
            if attempt:
                return 0, f"connection failed: {type(exc).__name__}"
    raise AssertionError("unreachable")


async def _post_once(session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str]) -> tuple[int, str | None]:
    async with session.post(url, json=body, headers=headers) as r:
        text = await r.text()
        if r.status == 200:
            return 200, None
        try:
            err = json.loads(text)
            message = err.get("error", {}).get("message") if isinstance(err.get("error"), dict) else err.get("message")
        except ValueError:
            message = text
        return r.status, str(message)[:160]


async def run_corpus(
    *, gateway_url: str, model: str, recorder: Any, values: dict[str, str], key_b: str | None,
    direct_url: str | None = None, cases: list[tuple[str, Any]] | None = None,
) -> list[Outcome]:
    """Send every case as tenant B through the gateway (and directly, with ``direct_url``)."""
    outcomes = []
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for name, raw_part in cases or CASES:
            part = fill(raw_part, values)
            before = len(recorder.bodies)
            status, error = await _post(session, gateway_url, request(model, part), key_b)
            forwarded = [p for body in recorder.bodies[before:] for m in body["messages"]
                         if isinstance(m.get("content"), list) for p in m["content"][1:]]
            outcomes.append(Outcome(name, part, status, error, forwarded))
        if direct_url is not None:  # after the gateway pass, so origin hits can be told apart
            for outcome in outcomes:
                outcome.direct_status, outcome.direct_error = await _post(
                    session, direct_url, request(model, outcome.part), None)
    return outcomes


async def run_api_corpus(*, gateway_url: str, direct_url: str, model: str, values: dict[str, str],
                         key_b: str | None) -> list[Outcome]:
    """Every ``api_corpus.API_CASES`` case through the gateway (as tenant B) and to the backend directly."""
    outcomes = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for name, path, raw_body in API_CASES:
            body = fill(raw_body, {**values, "model": model})
            status, error = await _post(session, gateway_url, body, key_b, path)
            direct_status, direct_error = await _post(session, direct_url, body, None, path)
            outcomes.append(Outcome(name, body, status, error, direct_status=direct_status, direct_error=direct_error))
    return outcomes


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (seed, 40, 90)).save(buf, "PNG")
    return buf.getvalue()


@dataclass
class CorpusRun:
    outcomes: list[Outcome]
    tag_b: str
    secret_hits: int  # through the gateway
    allowed: str
    values: dict[str, str] = field(default_factory=dict)  # what the placeholders stood for
    secret_hits_direct: int = 0  # by the backend itself, sent the parts directly
    api_outcomes: list[Outcome] = field(default_factory=list)  # api_corpus.API_CASES (with ``direct``)


@asynccontextmanager
async def _sim_or(backend: tuple[str, str] | None) -> AsyncIterator[tuple[str, str]]:
    if backend is not None:
        yield backend
        return
    async with running_sims(1) as sims:
        yield sims[0].url, MODEL


@asynccontextmanager
async def corpus_run(
    tmp_path: Path, *, direct: bool = False, backend: tuple[str, str] | None = None
) -> AsyncIterator[CorpusRun]:
    """The whole corpus through a real gateway (tenants A and B) in front of a recording proxy and a
    backend — ``backend`` (its URL and model: real vLLM), else a sim engine; ``direct``: each case
    also sent to the backend itself, after the gateway pass."""
    keys = tmp_path / "keys.txt"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    origin = await ImageOrigin().start()
    try:
        secret = origin.add("secret.png", png(1))  # http://127.0.0.1:PORT/...: the policy refuses it
        allowed = origin.add("ok.png", png(2)).replace("127.0.0.1", "localhost")  # opened by name
        png_url = "data:image/png;base64," + base64.b64encode(png(3)).decode()
        async with _sim_or(backend) as (backend_url, model), recording_proxy(backend_url) as rec:
            settings = gateway_settings(backends=vllm_specs([rec]), api_keys_file=str(keys),
                                        media={"allowed_private": ("localhost",)})
            async with running_gateway(settings) as gw, aiohttp.ClientSession() as s:
                victim = {"type": "image_url", "image_url": {"url": png_url}, "uuid": "victim"}
                async with s.post(gw.url + "/v1/chat/completions", json=request(model, victim),
                                  headers={"Authorization": "Bearer key-a"}) as r:
                    assert r.status == 200
                victim_key = rec.bodies[-1]["messages"][0]["content"][1]["uuid"]
                values = {"secret": secret, "origin": allowed, "png": png_url, "victim_key": victim_key,
                          "content_key": gw.gateway.keys.content_uuid("tenant-b", "0" * 64),
                          "secret_decimal": secret.replace("127.0.0.1", "2130706433"),
                          "missing": allowed.replace("/img/ok.png", "/status/404"), "undecodable": UNDECODABLE,
                          "video": VIDEO}
                outcomes = await run_corpus(gateway_url=gw.url, model=model, recorder=rec, values=values,
                                            key_b="key-b")
                hits = origin.hits["/img/secret.png"]
                api_outcomes: list[Outcome] = []
                if direct:
                    outcomes = await run_corpus(gateway_url=gw.url, model=model, recorder=rec, values=values,
                                                key_b="key-b", direct_url=backend_url)
                    api_outcomes = await run_api_corpus(gateway_url=gw.url, direct_url=backend_url, model=model,
                                                        values=values, key_b="key-b")
                tag_b = gw.gateway.keys.tenant_tag("tenant-b")
                values["tag_b"] = tag_b
                yield CorpusRun(outcomes, tag_b, hits, allowed, values,
                                origin.hits["/img/secret.png"] - 2 * hits, api_outcomes)
    finally:
        await origin.stop()
