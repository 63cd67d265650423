"""The send/heal loop (``ReuseSender``) against a real sim engine (a vLLM stand-in) on loopback:
repeats stripped, a cache miss healed from the UUID store, an unknown uuid refused naming the part,
``openai`` backends resolved to bytes; and vLLM's two cache-miss body shapes recognised."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from mmgate.backends import BackendKind, BackendReply, HTTPBackend
from mmgate.config import GatewaySettings
from mmgate.errors import BackendStatusError, UnknownUUIDError
from mmgate.fleet import BackendHoldings
from mmgate.metrics import GatewayMetrics
from mmgate.reuse import (
    ImageSlot,
    KeySpace,
    ReuseSender,
    UUIDStore,
    plan_slots,
    reply_cache_miss_index,
)
from mmgate.sim import SimServer
from mmgate.store import LoadedImage
from mmgate.vllm_protocol import cache_miss_message
from tests.support.gateway import running_sims
from tests.support.images import solid_image
from tests.support.recorder import Recorder, recording_proxy

MODEL = "mmgate-sim-vl"


def loaded(seed: int) -> LoadedImage:
    data = solid_image(32, 32, "PNG", seed)
    return LoadedImage(data=data, mime="image/png", width=32, height=32, digest=hashlib.sha256(data).hexdigest())


def request(*slots: tuple[str | None, str | None]) -> tuple[dict[str, Any], list[ImageSlot]]:
    """A body with one image part per (url, uuid), and its slots (as the parser would make them)."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": "hi"}]
    out = []
    for i, (url, uuid) in enumerate(slots):
        part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url} if url else None}
        if uuid:
            part["uuid"] = uuid
        parts.append(part)
        out.append(ImageSlot(index=i, param=f"messages[0].content[{i + 1}]", part=part, url=url, uuid=uuid))
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}, out


class Harness:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.store = UUIDStore(1 << 24, 600)
        self.keys = KeySpace(b"k" * 32)
        self.holdings = BackendHoldings.for_settings(GatewaySettings())
        self.sender = ReuseSender(self.store, self.holdings, GatewayMetrics(self.registry), auto=True)

    def heals(self) -> float | None:
        return self.registry.get_sample_value("mmgate_reuse_heals_total")


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with running_sims(1) as sims:
        yield sims[0]


@pytest.fixture
async def recorder(sim: SimServer) -> AsyncIterator[Recorder]:
    async with recording_proxy(sim.url) as rec:
        yield rec


def backend(url: str, kind: BackendKind = "vllm") -> HTTPBackend:
    return HTTPBackend("b0", kind, url, connect_timeout_s=2.0, read_timeout_s=10.0)


async def send(h: Harness, b: HTTPBackend, body: dict[str, Any], slots: list[ImageSlot],
               images: dict[int, LoadedImage]) -> tuple[BackendReply, Any]:
    plans = plan_slots(h.store, slots, images, h.keys, None)
    reply, counts = await h.sender.send(b, body, plans, stream=False)
    reply.release()
    return reply, counts


async def test_repeat_is_stripped_then_a_miss_is_healed(sim: SimServer, recorder: Recorder) -> None:
    h, b = Harness(), backend(recorder.url)
    image = loaded(1)
    body, slots = request(("http://o/1.png", "u1"))
    _, counts = await send(h, b, body, slots, {0: image})
    assert (counts.sent, counts.stripped) == (1, 0)
    assert h.holdings.holders(plan_slots(h.store, slots, {0: image}, h.keys, None)[0].key) == ["b0"]
    body, slots = request(("http://o/1.png", "u1"))
    _, counts = await send(h, b, body, slots, {0: image})
    assert (counts.sent, counts.stripped) == (0, 1)
    assert recorder.image_parts() == [{"type": "image_url", "image_url": None, "uuid": "u1"}]
    # A fresh backend of the same name never saw u1: it answers vLLM's cache miss, the sender heals.
    async with running_sims(1) as fresh, recording_proxy(fresh[0].url) as rec2:
        body, slots = request((None, "u1"))
        reply, counts = await send(h, backend(rec2.url), body, slots, {})
        assert reply.status == 200 and counts.healed == 1 and h.heals() == 1
        assert len(rec2.bodies) == 2
        assert rec2.image_parts(0) == [{"type": "image_url", "image_url": None, "uuid": "u1"}]
        assert rec2.image_parts(1)[0]["image_url"]["url"] == image.data_url()
        # Forgotten on the miss, held again once the re-send with data was answered.
        assert h.holdings.num_held("b0") == 1
    await b.close()


async def test_unknown_uuid_is_the_clients_400(sim: SimServer) -> None:
    h, b = Harness(), backend(sim.url)
    body, slots = request((None, "never-sent"))
    with pytest.raises(UnknownUUIDError) as info:
        await send(h, b, body, slots, {})
    assert info.value.status == 400 and info.value.param == "messages[0].content[1]"
    assert h.holdings.num_held("b0") == 0  # not answered: nothing recorded
    await b.close()


async def test_openai_backend_gets_bytes_and_no_uuid(sim: SimServer, recorder: Recorder) -> None:
    h = Harness()
    image = loaded(2)
    h.store.put("u2", image)
    body, slots = request((None, "u2"))
    reply, counts = await send(h, backend(recorder.url, "openai"), body, slots, {})
    assert reply.status == 200 and counts.sent == 1
    assert recorder.image_parts() == [{"type": "image_url", "image_url": {"url": image.data_url()}}]


async def test_other_backend_errors_pass_through(sim: SimServer) -> None:
    h, b = Harness(), backend(sim.url)
    body, slots = request()
    body["max_tokens"] = -1
    with pytest.raises(BackendStatusError) as info:
        await send(h, b, body, slots, {})
    assert info.value.status == 400 and "max_tokens" in info.value.message
    assert h.heals() == 0
    await b.close()


@pytest.mark.parametrize(
    ("status", "body", "index"),
    [
        (400, {"error": {"message": cache_miss_message(3), "type": "BadRequestError", "code": 400}}, 3),
        (400, {"object": "error", "message": cache_miss_message(0), "code": 400}, 0),
        (400, {"error": {"message": "Cache miss for image but data is not provided."}}, -1),
        (500, {"error": {"message": cache_miss_message(0)}}, None),
        (400, {"error": {"message": "max_tokens must be at least 1"}}, None),
    ],
)
def test_cache_miss_shapes(status: int, body: dict[str, Any], index: int | None) -> None:
    reply = BackendReply(status=status, content_type="application/json", body=orjson.dumps(body))
    assert reply_cache_miss_index(reply) == index
