"""The sim's ``/v1/responses`` routes: a request mapped onto chat (``mmgate.sim.responses_api``)
and admitted as chat is, its answer written as a response on the chat path's timings. With
``--responses-store-mb`` (``mmgate.sim.response_store``), as vLLM with its store: a response is
kept under its request's ``request_id`` once answered, a ``previous_response_id`` continues it, a
``background`` request answers at once (``queued``) and runs on, ``GET /v1/responses/{id}``
reads it (``?stream=true&starting_after=N``: a background stream's events again), and
``POST …/cancel`` cancels it while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from mmgate.app_runtime import json_response
from mmgate.sim.engine import Admitted, SimEngine, sleep_until
from mmgate.sim.errors import InvalidRequestError, SimError
from mmgate.sim.response_store import ENTRY_OVERHEAD_BYTES, ResponseStore, Stored
from mmgate.sim.responses_api import ResponseWriter, check_fields, error_body, not_found, to_chat_body

_EVENT_STREAM = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# FastAPI's reading of a boolean query parameter (vLLM's ``?stream=``).
_FALSE = frozenset({"false", "0", "no", "off", ""})
_BOOLEAN = _FALSE | {"true", "1", "yes", "on"}


@dataclass
class _Run:
    """One answer's generation: the tokens sent so far."""

    engine: SimEngine
    admitted: Admitted
    writer: ResponseWriter
    first_token_at: float
    sent: int = 0

    async def groups(self) -> AsyncIterator[list[bytes]]:
        """The stream's events on the modelled timings, in the groups vLLM writes together."""
        plan = self.admitted.plan
        await sleep_until(self.first_token_at)
        yield self.writer.opening()
        for i, token in enumerate(plan.tokens):
            await sleep_until(self.first_token_at + i * self.admitted.decode_s)
            self.sent += 1
            yield [self.writer.delta(token)]
        yield self.writer.closing(plan.text, plan.finish_reason, self.sent)

    async def whole(self) -> None:
        """Wait for the last token of an answer not streamed."""
        plan = self.admitted.plan
        await sleep_until(self.first_token_at + max(0, len(plan.tokens) - 1) * self.admitted.decode_s)
        self.sent = len(plan.tokens)

    def answered(self) -> dict[str, Any]:
        """The response, counted as answered."""
        plan = self.admitted.plan
        self.engine.metrics.tokens(0, self.sent)
        self.engine.metrics.success(plan.finish_reason)
        self.engine.metrics.request(200)
        return self.writer.response(plan.text, plan.finish_reason, self.sent)


def _refused(engine: SimEngine, exc: SimError) -> web.Response:
    engine.metrics.request(exc.status)
    return json_response(error_body(exc), status=exc.status)


async def create(request: web.Request, engine: SimEngine, raw: bytes, arrived: float) -> web.StreamResponse:
    """``POST /v1/responses``."""
    store = engine.stored
    try:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"Invalid JSON in request body: {exc}.") from exc
        check_fields(body, stores=store is not None)
        previous = body.get("previous_response_id")
        earlier = store.get(previous) if store is not None and previous is not None else None
        chat = to_chat_body(body, earlier.history() if earlier is not None else None)
        admitted = await engine.admit_body(chat)
    except SimError as exc:
        return _refused(engine, exc)
    run = _Run(engine, admitted, ResponseWriter(body, admitted.request.model, admitted.prompt_tokens),
               engine.first_token_at(arrived, admitted.prefill_s))
    engine.metrics.tokens(admitted.prompt_tokens, 0)
    kept = None
    if store is not None and body.get("store", True):
        # Counted as the request bodies of its conversation (``response_store``).
        size = len(raw) + (earlier.size if earlier is not None else 0) + ENTRY_OVERHEAD_BYTES
        kept = Stored(response=run.writer.queued(), messages=chat["messages"], size=size)
    if body.get("background"):  # check_fields: only with a store, and store true
        assert kept is not None and store is not None
        kept.events = [] if admitted.request.stream else None
        kept.task = asyncio.create_task(_background(run, kept, store))
        store.put(run.writer.response_id, kept)
        return await _replay(request, kept, None) if admitted.request.stream else json_response(kept.response)
    engine.metrics.running(+1)
    try:
        if not admitted.request.stream:
            await run.whole()
            response = run.answered()
            answer: web.StreamResponse = json_response(response)
        else:
            answer = web.StreamResponse(headers=_EVENT_STREAM)
            await answer.prepare(request)
            try:
                async for group in run.groups():
                    await answer.write(b"".join(group))
                await answer.write_eof()
            except ConnectionResetError:  # as the chat stream: stop generating
                engine.disconnected(run.sent)
                return answer
            except asyncio.CancelledError:
                engine.disconnected(run.sent)
                raise
            response = run.answered()
    finally:
        engine.metrics.running(-1)
    if kept is not None and store is not None:
        kept.response = response
        store.put(run.writer.response_id, kept)
    return answer


async def _background(run: _Run, kept: Stored, store: ResponseStore) -> None:
    """A background request's generation; its answer replaces the ``queued`` response (its events,
    streamed, counted in its size from then on)."""
    run.engine.metrics.running(+1)
    try:
        if kept.events is None:
            await run.whole()
        else:
            async for group in run.groups():
                for event in group:
                    kept.add_event(event)
            kept.size += sum(map(len, kept.events))
        kept.response = run.answered()
        store.put(run.writer.response_id, kept)
    except asyncio.CancelledError:
        run.engine.metrics.tokens(0, run.sent)
        run.engine.metrics.request("cancelled")
        raise
    finally:
        run.engine.metrics.running(-1)
        kept.ended()


async def _replay(request: web.Request, kept: Stored, starting_after: int | None) -> web.StreamResponse:
    answer = web.StreamResponse(headers=_EVENT_STREAM)
    await answer.prepare(request)
    try:
        async for event in kept.replay(starting_after):
            await answer.write(event)
        await answer.write_eof()
    except ConnectionResetError:  # the reader went away; the run goes on
        pass
    return answer


async def retrieve(request: web.Request, engine: SimEngine) -> web.StreamResponse:
    """``GET /v1/responses/{id}``: the stored response, or with ``?stream=true`` a background
    stream's events after ``starting_after``."""
    response_id = request.match_info["response_id"]
    try:
        kept = engine.stored.get(response_id) if engine.stored is not None else None
        if kept is None:
            raise not_found(response_id)
        stream = request.query.get("stream", "").lower()
        if stream not in _BOOLEAN:
            raise InvalidRequestError("'stream' must be a boolean.", param="stream")
        if stream in _FALSE:
            return json_response(kept.response)
        after = request.query.get("starting_after")
        try:
            starting_after = None if after is None else int(after)
        except ValueError:
            raise InvalidRequestError("'starting_after' must be an integer.", param="starting_after") from None
        if kept.events is None:
            raise InvalidRequestError(f"Unknown response_id: {response_id}", param="response_id")
    except SimError as exc:
        return json_response(error_body(exc), status=exc.status)
    return await _replay(request, kept, starting_after)


async def cancel(request: web.Request, engine: SimEngine) -> web.Response:
    """``POST /v1/responses/{id}/cancel``: a background response still running, cancelled."""
    response_id = request.match_info["response_id"]
    kept = engine.stored.get(response_id) if engine.stored is not None else None
    if kept is None:
        return json_response(error_body(not_found(response_id)), status=404)
    if kept.response.get("status") not in ("queued", "in_progress"):
        exc = InvalidRequestError("Cannot cancel a synchronous response.", param="response_id")
        return json_response(error_body(exc), status=exc.status)
    kept.response = {**kept.response, "status": "cancelled"}
    if kept.task is not None:
        kept.task.cancel()
        await asyncio.wait([kept.task])
    return json_response(kept.response)
