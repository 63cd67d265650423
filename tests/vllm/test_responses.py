"""The OpenAI Responses API through the gateway against real vLLM: the same answers as vLLM's own
``/v1/responses`` (a differential corpus at temperature 0, plain and streamed), repeated images
sent as cache-only references, stored responses reached on the replica that holds them, and bad
input answered with a 4xx in OpenAI's error shape, never a 500.

The replicas run with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``tests.support.vllm.VLLM_ENV``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.agents import Reply, call, is_openai_error
from tests.support.vllm import SERVED_MODEL, GatewayProcess, VllmReplica, running_gateway_process
from tests.vllm.conftest import GATEWAY_FLAGS
from tests.vllm.helpers import fresh_jpeg

M = SERVED_MODEL
SHOT = fresh_jpeg()


def image(url: str = SHOT, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **extra}


def req(items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": M, "max_output_tokens": 6, "temperature": 0, "input": items, **extra}


FN = [{"type": "function", "name": "screenshot", "description": "Take a screenshot",
       "parameters": {"type": "object", "properties": {}}}]
CORPUS: dict[str, dict[str, Any]] = {
    "text": req("Hello"),
    "instructions": req("Hi", instructions="You are terse."),
    "image": req([{"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, image()]}]),
    "message-items": req([{"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "Look"}, image(detail="low")]},
                          {"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": "A picture."}]},
                          {"role": "user", "content": "Again?"}]),
    "function-call-output-with-screenshot": req(
        [{"role": "user", "content": "Take a screenshot"},
         {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1",
          "output": [{"type": "input_text", "text": "here"}, image(detail="auto")]}],
        tools=FN, tool_choice="none"),
    "top-p": req("Hi", top_p=0.5),
    "unknown-model": {**req("Hi"), "model": "no-such-model"},
}


async def _pair(gateway: GatewayProcess, replicas: list[VllmReplica], body: dict[str, Any]) -> tuple[Reply, Reply]:
    via = await call(gateway.url, "/v1/responses", body)
    name = via.headers.get("x-mmgate-backend")
    replica = replicas[int(name.rsplit("-", 1)[1])] if name else replicas[0]
    return via, await call(replica.url, "/v1/responses", body)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", list(CORPUS))
async def test_same_answer_as_vllms_own_endpoint(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], name: str, stream: bool
) -> None:
    via, direct = await _pair(gateway, vllm_replicas, {**CORPUS[name], "stream": stream})
    if via.status != 200:
        # The gateway's own refusal (unknown model) is its 404 in OpenAI's shape, as vLLM's.
        assert via.status == direct.status and is_openai_error(via)
        return
    assert via.normalised() == direct.normalised()
    if stream:
        names = [event for event, _ in via.events]
        assert names[0] == "response.created" and names[-1] == "response.completed"


async def test_second_turn_sends_the_repeated_image_as_a_reference(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica]
) -> None:
    headers = {"x-session-id": "responses-reuse"}
    first, second = fresh_jpeg(), fresh_jpeg()
    turn1 = [{"role": "user", "content": [{"type": "input_text", "text": "Click OK"}, image(first)]}]
    one = await call(gateway.url, "/v1/responses", req(turn1, store=False), headers=headers)
    assert one.status == 200 and one.reuse()["sent"] == 1
    replica = vllm_replicas[int(one.headers["x-mmgate-backend"].rsplit("-", 1)[1])]
    _, hits_before = replica.cache_counters()
    turn2 = [*turn1,
             {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": [image(second, detail="auto")]}]
    two = await call(gateway.url, "/v1/responses", req(turn2, store=False, tools=FN, tool_choice="none"),
                     headers=headers)
    assert two.status == 200, two.json
    assert two.reuse() == {"sent": 1, "stripped": 1, "referenced": 0, "healed": 0}
    _, hits_after = replica.cache_counters()
    assert hits_after >= hits_before + 1
    direct = await call(replica.url, "/v1/responses", req(turn2, store=False, tools=FN, tool_choice="none"))
    assert two.normalised() == direct.normalised()


async def test_stored_response_is_reached_on_its_replica(
    gateway: GatewayProcess, vllm_replicas: list[VllmReplica], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """GET and previous_response_id go to the replica that holds the response; another replica
    would answer 404 — and so does the gateway, naming why, for an id nobody holds."""
    made = await call(gateway.url, "/v1/responses", req([{"role": "user", "content": [image()]}], store=True))
    assert made.status == 200
    response_id = made.json["id"]
    home = int(made.headers["x-mmgate-backend"].rsplit("-", 1)[1])
    other = vllm_replicas[1 - home]
    assert (await call(other.url, f"/v1/responses/{response_id}", method="GET")).status == 404
    for _ in range(3):  # whichever replica the router would pick, the stored one answers
        got = await call(gateway.url, f"/v1/responses/{response_id}", method="GET")
        assert got.status == 200 and got.json["id"] == response_id
        assert got.headers["x-mmgate-backend"] == made.headers["x-mmgate-backend"]
    follow = await call(gateway.url, "/v1/responses", req("And then?", previous_response_id=response_id),
                        headers={"x-session-id": "elsewhere"})
    assert follow.status == 200 and follow.headers["x-mmgate-backend"] == made.headers["x-mmgate-backend"]
    # A gateway that never relayed it finds it by asking the replicas.
    log = tmp_path_factory.mktemp("gateway2") / "mmgate.log"
    with running_gateway_process([r.url for r in vllm_replicas], log, *GATEWAY_FLAGS) as fresh:
        got = await call(fresh.url, f"/v1/responses/{response_id}", method="GET")
        assert got.status == 200 and got.headers["x-mmgate-backend"] == made.headers["x-mmgate-backend"]
    missing = await call(gateway.url, "/v1/responses/resp_0000000000000000", method="GET")
    assert missing.status == 404 and is_openai_error(missing) and "no backend holds it" in missing.json["error"]["message"]
    lost = await call(gateway.url, "/v1/responses", req("Hi", previous_response_id="resp_0000000000000000"))
    assert lost.status == 404 and lost.json["error"]["param"] == "previous_response_id"


async def test_background_response_is_cancelled_on_its_replica(gateway: GatewayProcess) -> None:
    made = await call(gateway.url, "/v1/responses", {**req("Count to a thousand"), "max_output_tokens": 2000,
                                                     "background": True, "store": True})
    assert made.status == 200 and made.json["status"] in ("queued", "in_progress"), made.json
    cancelled = await call(gateway.url, f"/v1/responses/{made.json['id']}/cancel")
    assert cancelled.status in (200, 400), cancelled.json  # 400: it had finished already
    assert cancelled.headers["x-mmgate-backend"] == made.headers["x-mmgate-backend"]
    for _ in range(50):
        got = await call(gateway.url, f"/v1/responses/{made.json['id']}", method="GET")
        if got.json["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.2)
    assert got.json["status"] in ("cancelled", "completed", "incomplete")


BAD: dict[str, Any] = {
    "not-json": b"{not json",
    "array-body": b"[]",
    "input-number": {"model": M, "input": 7},
    "item-not-object": {"model": M, "input": ["hi"]},
    "stream-string": {"model": M, "input": "hi", "stream": "yes"},
    "file-id-image": req([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]),
    "input-file": req([{"role": "user", "content": [{"type": "input_file", "file_url": "http://10.0.0.1/a.pdf"}]}]),
    "computer-call-output": req([{"type": "computer_call_output", "call_id": "c",
                                  "output": {"type": "computer_screenshot", "image_url": "http://10.0.0.1/s.png"}}]),
    "private-url": req([{"role": "user", "content": [image("http://10.1.2.3/a.png")]}]),
    "metadata-url": req([{"role": "user", "content": [image("http://169.254.169.254/x")]}]),
    "tool-output-private-url": req([{"type": "function_call_output", "call_id": "c",
                                     "output": [image("http://127.0.0.2:1/x.png", detail="auto")]}]),
    "image-url-object": req([{"role": "user", "content": [{"type": "input_image", "image_url": {"url": SHOT}}]}]),
    "image-not-an-image": req([{"role": "user", "content": [image("data:image/png;base64,aGVsbG8=")]}]),
    "bad-detail": req([{"role": "user", "content": [image(detail="ultra")]}]),
    "empty-image": req([{"role": "user", "content": [{"type": "input_image"}]}]),
    "unknown-reference": req([{"role": "user", "content": [{"type": "input_image", "image_url": None,
                                                            "uuid": "never-sent"}]}]),
    "previous-id-number": req("hi", previous_response_id=5),
    "unknown-model": {**req("hi"), "model": "nope"},
    "max-output-tokens-string": req("hi", max_output_tokens="x"),
}


@pytest.mark.parametrize("name", list(BAD))
async def test_bad_input_is_a_4xx_in_openais_shape(gateway: GatewayProcess, name: str) -> None:
    case = BAD[name]
    raw = case if isinstance(case, bytes) else None
    reply = await call(gateway.url, "/v1/responses", None if raw else case, raw=raw)
    assert 400 <= reply.status < 500, (reply.status, reply.json)
    assert is_openai_error(reply), reply.json


async def test_a_miss_on_the_pinned_replica_is_healed(gateway: GatewayProcess) -> None:
    """A follow-up pinned to the replica holding its previous response references an image only
    the other replica saw: vLLM's real "Cache miss" on /v1/responses, healed from the gateway's
    uuid store, and the client gets its answer."""
    seeded = await call(gateway.url, "/v1/responses", req([{"role": "user", "content": [
        image(fresh_jpeg(), uuid="heal-1")]}], store=False), headers={"x-session-id": "heal-seed"})
    assert seeded.status == 200 and seeded.reuse()["sent"] == 1
    home = seeded.headers["x-mmgate-backend"]
    other = None
    for n in range(40):  # a stored response on the other replica (sessions spread over both)
        made = await call(gateway.url, "/v1/responses", {**req("Hi", store=True), "max_output_tokens": 1},
                          headers={"x-session-id": f"heal-other-{n}"})
        if made.headers["x-mmgate-backend"] != home:
            other = made
            break
    assert other is not None, "no session was routed to the other replica"
    follow = await call(gateway.url, "/v1/responses", req(
        [{"role": "user", "content": [{"type": "input_image", "image_url": None, "uuid": "heal-1"}]}],
        previous_response_id=other.json["id"]))
    assert follow.status == 200, follow.json
    assert follow.headers["x-mmgate-backend"] == other.headers["x-mmgate-backend"]
    assert follow.reuse()["healed"] == 1
