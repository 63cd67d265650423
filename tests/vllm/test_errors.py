"""vLLM's own 4xx answers relayed through the gateway with their status and message; the
gateway's own 400 when neither vLLM nor the gateway holds a referenced image."""

from __future__ import annotations

import pytest

from tests.support.bombs import png
from tests.support.images import data_url
from tests.support.vllm import GatewayProcess, VllmReplica
from tests.vllm.helpers import body, chat, fresh_jpeg, image


@pytest.mark.parametrize(
    ("extra", "images", "message", "param"),
    [
        ({"max_tokens": 5000}, 0, "max_tokens=5000 cannot be greater than max_model_len=4096", "max_tokens"),
        ({}, 9, "At most 8 image(s) may be provided in one prompt.", "image"),
        ({"temperature": -1}, 0, "temperature must be non-negative", None),
    ],
    ids=["max-tokens", "too-many-images", "temperature"],
)
async def test_vllm_4xx_is_relayed_with_its_message(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], extra: dict[str, object], images: int,
    message: str, param: str | None,
) -> None:
    url = fresh_jpeg()
    payload = body(*[image(url)] * images, **extra)
    direct = await chat(vllm_replicas[0].url, payload)
    through = await chat(gateway.url, payload, {"x-session-id": "s-errors"})

    assert direct.status == 400 and message in direct.message, direct.json
    assert through.status == 400, through.json
    assert message in through.message
    if param is not None:
        assert direct.json["error"]["param"] == param


async def test_unknown_uuid_is_the_gateways_400_naming_it(gateway: GatewayProcess) -> None:
    answer = await chat(gateway.url, body(image(None, "never-sent")), {"x-session-id": "s-unknown"})
    assert answer.status == 400
    assert "never-sent" in answer.message
    assert answer.json["error"]["param"] == "messages[0].content[1]"


async def test_vllm_cache_miss_body_is_the_one_the_gateway_heals(vllm_replicas: list[VllmReplica]) -> None:
    """The exact answer docs/ARCHITECTURE.md quotes, from real vLLM (the gateway recognises it by status+message)."""
    answer = await chat(vllm_replicas[1].url, body(image(fresh_jpeg(), "known"), image(None, "never-sent-2")))
    assert answer.status == 400
    assert answer.json == {"error": {
        "message": "Cache miss for image at index 1 but data is not provided.",
        "type": "BadRequestError", "param": None, "code": 400,
    }}


async def test_a_png_with_malformed_pixels_under_intact_crcs_is_answered_as_vllm_answers_it(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica],
) -> None:
    """The gateway checks a PNG's chunks, not its pixels (mmgate.media.validate): one crafted to
    pass that check is vLLM's to judge, and the gateway answers as vLLM does directly (vLLM 0.32
    serves it: its loader's EXIF step swallows the decode error, and the image keeps the pixels
    that decoded); its repeat in a later turn is stripped like any other image."""
    bad = data_url(png(64, compressed=b"\x78\x9c" + bytes(range(256)) * 8))
    direct = await chat(vllm_replicas[0].url, body(image(bad)))
    first = await chat(gateway.url, body(image(bad)), {"x-session-id": "s-bad-pixels"})
    assert first.status == direct.status, (direct.json, first.json)
    second = await chat(gateway.url, body(image(fresh_jpeg()), image(bad)), {"x-session-id": "s-bad-pixels"})
    assert second.status == direct.status, second.json
    if direct.status == 200:
        assert second.reuse()["stripped"] == 1, second.headers
