"""A sim engine that also serves the Responses API's stored responses the way vLLM 0.32 does with
``VLLM_ENABLE_RESPONSES_API_STORE=1``, for gateway tests that need one on loopback (real vLLM
needs a GPU or its CPU build: tests/vllm/test_responses.py proves the answers against it).

What it keeps of vLLM: a response is named by the request's ``request_id`` (``resp_<hex>`` when
absent) and stored in this replica's memory under that name — a second request with the same
``request_id`` overwrites it; ``previous_response_id`` continues a stored conversation (404 when
unknown); ``GET /v1/responses/{id}`` returns it, ``POST …/cancel`` cancels a background one (400
when it is not running). The answer's text names its input and the conversation's earlier inputs,
so a test can see whose history a response continued. Every other path is the sim's (whose own
``/v1/responses`` is a vLLM's without the store).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from mmgate.app_runtime import json_response, start_app
from mmgate.sim.server import build_app
from tests.support.gateway import FAST_SIM

_STORE = web.AppKey("responses_store", dict)


def _not_found(response_id: str) -> web.Response:
    return json_response({"error": {"message": f"Response with id '{response_id}' not found.",
                                    "type": "invalid_request_error", "param": None, "code": 404}}, status=404)


async def _create(request: web.Request) -> web.Response:
    store: dict[str, dict[str, Any]] = request.app[_STORE]
    body = await request.json()
    response_id = body.get("request_id") or f"resp_{uuid.uuid4().hex}"
    history: list[str] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if previous not in store:
            return _not_found(previous)
        history = [*store[previous]["history"], store[previous]["said"]]
    said = str(body.get("input"))
    response = {"id": response_id, "object": "response", "model": body.get("model"),
                "status": "in_progress" if body.get("background") else "completed",
                "output_text": " | ".join([*history, said]), "history": history, "said": said}
    if body.get("store", True):
        store[response_id] = response
    return json_response(response)


async def _retrieve(request: web.Request) -> web.Response:
    found = request.app[_STORE].get(request.match_info["response_id"])
    return json_response(found) if found is not None else _not_found(request.match_info["response_id"])


async def _cancel(request: web.Request) -> web.Response:
    found = request.app[_STORE].get(request.match_info["response_id"])
    if found is None:
        return _not_found(request.match_info["response_id"])
    if found["status"] != "in_progress":
        return json_response({"error": {"message": "Cannot cancel a synchronous response.",
                                        "type": "invalid_request_error", "param": None, "code": 400}}, status=400)
    found["status"] = "cancelled"
    return json_response(found)


@asynccontextmanager
async def running_responses_engine() -> AsyncIterator[tuple[str, dict[str, dict[str, Any]]]]:
    """A sim engine with a Responses store on a free loopback port: (its URL, the store)."""
    app = web.Application(client_max_size=FAST_SIM.max_body_bytes)
    store: dict[str, dict[str, Any]] = {}
    app[_STORE] = store
    app.router.add_post("/v1/responses", _create)  # before the sim's own (a vLLM without a store)
    app.router.add_get("/v1/responses/{response_id}", _retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", _cancel)
    build_app(FAST_SIM, app)
    runner, port = await start_app(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", store
    finally:
        await runner.cleanup()
