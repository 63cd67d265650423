"""SSE relay and ``n`` through the gateway against real vLLM, compared with vLLM answering directly."""

from __future__ import annotations

from typing import Any

from tests.support.vllm import GatewayProcess, VllmReplica
from tests.vllm.helpers import body, chat, fresh_jpeg, image, replica_for


def _shape(events: list[Any]) -> list[str]:
    """Each SSE event reduced to what vLLM decides: role, content, finish, usage-only, [DONE]."""
    shape = []
    for event in events:
        if event == "[DONE]":
            shape.append("done")
        elif not event["choices"]:
            shape.append("usage")
        else:
            choice = event["choices"][0]
            delta = choice["delta"]
            kind = "role" if "role" in delta else "finish" if choice.get("finish_reason") else "content"
            # vLLM holds back a token that ends inside a UTF-8 character and sends it with the next
            # one, so the number of content events depends on which tokens came out: one run of them.
            if not (kind == "content" and shape and shape[-1] == "content"):
                shape.append(kind)
    return shape


async def test_stream_with_include_usage_is_relayed_as_vllm_sent_it(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    url = fresh_jpeg()
    payload = body(image(url), stream=True, stream_options={"include_usage": True}, max_tokens=6, ignore_eos=True,
                   temperature=0)
    direct = await chat(vllm_replicas[0].url, payload)
    through = await chat(gateway.url, payload, {"x-session-id": "s-stream"})

    assert (direct.status, through.status) == (200, 200)
    assert through.headers["content-type"].startswith("text/event-stream")
    assert _shape(through.events) == _shape(direct.events)
    assert _shape(through.events)[-2:] == ["usage", "done"]
    usage = through.events[-2]["usage"]
    assert usage == direct.events[-2]["usage"]
    assert usage["completion_tokens"] == 6
    # 224x224 → a 8x8 grid of merged 28-pixel patches: 64 image tokens in the prompt.
    text_only = await chat(vllm_replicas[0].url, body(max_tokens=1))
    assert usage["prompt_tokens"] - text_only.json["usage"]["prompt_tokens"] == 64 + 2  # + vision start/end


async def test_stream_of_a_cache_only_reference(gateway: GatewayProcess, vllm_replicas: list[VllmReplica]) -> None:
    headers = {"x-session-id": "s-stream-ref"}
    first = await chat(gateway.url, body(image(fresh_jpeg(), "st-1")), headers)
    replica = replica_for(first, vllm_replicas)
    queries, hits = replica.cache_counters()
    streamed = await chat(gateway.url, body(image(None, "st-1"), stream=True,
                                            stream_options={"include_usage": True}), headers)
    assert streamed.status == 200
    assert streamed.reuse()["referenced"] == 1
    assert streamed.events[-1] == "[DONE]"
    assert streamed.events[-2]["usage"]["prompt_tokens"] == first.json["usage"]["prompt_tokens"]
    assert replica.cache_counters() == (queries + 1, hits + 1)


async def test_n_2_non_streaming_and_streaming(gateway: GatewayProcess) -> None:
    headers = {"x-session-id": "s-n2"}
    whole = await chat(gateway.url, body(image(fresh_jpeg()), n=2, ignore_eos=True), headers)
    assert whole.status == 200, whole.json
    assert [c["index"] for c in whole.json["choices"]] == [0, 1]
    assert whole.json["usage"]["completion_tokens"] == 2 * 4

    streamed = await chat(gateway.url, body(image(fresh_jpeg()), n=2, stream=True, ignore_eos=True,
                                            stream_options={"include_usage": True}), headers)
    assert streamed.status == 200
    indices = {e["choices"][0]["index"] for e in streamed.events[:-1] if e != "[DONE]" and e["choices"]}
    assert indices == {0, 1}
    assert streamed.events[-2]["usage"]["completion_tokens"] == 2 * 4
