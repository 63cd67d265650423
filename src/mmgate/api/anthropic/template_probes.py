"""What a model's chat template makes of two Messages settings vLLM maps by probing the template
itself, asked of a replica the way vLLM asks, so that such a request can be mapped onto chat (its
repeated images stripped) instead of going to vLLM's ``/v1/messages`` as it is:

* ``thinking: {"type": "disabled"}`` → a ``reasoning_effort`` (vLLM's
  ``_probe_disabled_thinking_effort``): vLLM's probe prompt rendered with each effort; ``none``
  unless the template rejects it or renders it as some effort, then ``low``. Rendered on the
  replica's ``/tokenize``, given the template arguments a chat ``reasoning_effort`` becomes
  (``reasoning_effort``, ``enable_thinking``): vLLM's ``/v1/chat/completions/render`` would be
  direct, but it serves it only with ``--enable-scale-out``.
* a system message inside ``messages`` → merged into the leading system prompt or kept in place
  (vLLM's ``_should_merge_inline_system``, a render of the template in a bare sandbox). Asked of
  vLLM itself: its ``/v1/messages/count_tokens`` counts a probe conversation as it maps it, and the
  two chat mappings are counted on ``/tokenize``; the one with vLLM's count is vLLM's.

Every replica the request could go to is asked, and the request is mapped only when they all
give one answer: replicas of a model whose templates differ (a rolling upgrade) are not mapped by
one of them. One probe per (question, model, replica) at a time (concurrent requests wait for the
first one), its answer kept ``TTL_S`` and used while it is asked again; a replica that cannot
answer (an older vLLM, a failure) answers None, and the request is then forwarded as before. A
backend that serves no probe path at all (404: the embedded ``sim``, a chat-only engine) has no
template to ask: its answers are a chat backend's
(``thinking: disabled`` as ``reasoning_effort: none``, a system message kept where it stands).
Bounded: ``MAX_PROBES`` probes at once, ``MAX_ANSWERS`` answers kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from mmgate.api.anthropic.reply import path_not_served
from mmgate.backends import Backend
from mmgate.errors import MmgateError

TOKENIZE_PATH = "/tokenize"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# vLLM's efforts, probed in its order (``AnthropicEffort``).
EFFORTS = ("low", "medium", "high", "xhigh", "max")
TTL_S = 300.0
PROBE_TIMEOUT_S = 5.0
# Probes at once and answers kept, at most (a fleet serves a few models; before any backend has
# answered, a client names any model it likes).
MAX_PROBES = 64
MAX_ANSWERS = 256

log = logging.getLogger(__name__)
Answer = Any  # an effort (str), a merge (bool), or None: not known
Key = tuple[str, str, str]  # question, model, replica


class TemplateProbes:
    """Per question, model and replica: what the model's chat template decides, or None (not known:
    forward)."""

    def __init__(self) -> None:
        self._known: dict[Key, tuple[float, Answer]] = {}
        self._probes: dict[Key, asyncio.Task[Answer]] = {}

    async def disabled_effort(self, model: str, backends: Sequence[Backend]) -> str | None:
        """The ``reasoning_effort`` that ``thinking: disabled`` means for ``model`` on every one of
        ``backends``."""
        answer: str | None = await self._agreed("disabled_effort", model, backends, _probe_effort)
        return answer

    async def merges_inline_system(self, model: str, backends: Sequence[Backend]) -> bool | None:
        """Whether every one of ``backends`` merges ``model``'s inline system messages into the
        leading system prompt (True), or none does (False)."""
        answer: bool | None = await self._agreed("merge_inline_system", model, backends, _probe_merge)
        return answer

    async def _agreed(self, question: str, model: str, backends: Sequence[Backend],
                      probe_of: Callable[[str, Backend], Awaitable[Answer]]) -> Answer:
        """The answer of every one of ``backends``, or None when one cannot answer or two differ.
        Known answers cost a dict lookup each (every agent turn asks); probes run side by side."""
        pending = [self._lookup((question, model, b.name), b, probe_of) for b in backends]
        answers = [await asyncio.shield(a) if isinstance(a, asyncio.Task) else a for a in pending]
        first = answers[0] if answers else None
        if first is None or any(a != first for a in answers):
            return None
        return first

    def _lookup(self, key: Key, backend: Backend, probe_of: Callable[[str, Backend], Awaitable[Answer]]
                ) -> Answer | asyncio.Task[Answer]:
        """The answer known for ``key``, or the probe to wait for (None: too many probes, forwarded)."""
        known = self._known.get(key)
        if known is not None and time.monotonic() - known[0] < TTL_S:
            return known[1]
        probe = self._probes.get(key)
        if probe is None and len(self._probes) < MAX_PROBES:
            probe = self._probes[key] = asyncio.create_task(_bounded(probe_of(key[1], backend)),
                                                            name="mmgate-template-probe")
            probe.add_done_callback(lambda done: self._settle(key, done))
        if known is not None:
            return known[1]  # out of date: still used while it is asked again, so no request waits
        return probe

    def _settle(self, key: Key, probe: asyncio.Task[Answer]) -> None:
        self._probes.pop(key, None)
        if not probe.cancelled() and probe.exception() is None:
            self._known.pop(key, None)  # asked again: now the latest
            if len(self._known) >= MAX_ANSWERS:
                del self._known[next(iter(self._known))]  # the longest known
            self._known[key] = (time.monotonic(), probe.result())
            # What the gateway maps these settings to, as vLLM logs its own probes' answers.
            log.info("Anthropic %s for model %r on backend %s: %r (None: unknown, forwarded as it is)",
                     *key, probe.result())


class _NotServed(Exception):
    """The backend answered 404: it serves no such path."""


async def _bounded(probe: Awaitable[Answer]) -> Answer:
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return await probe
    except (TimeoutError, MmgateError, _NotServed):
        return None


async def _probe_effort(model: str, backend: Backend) -> str | None:
    """vLLM's probe on ``backend``; None when the replica cannot render at all; ``none`` from a
    chat backend (no ``/tokenize``)."""
    try:
        none = await _tokens(model, backend, "none")
    except _NotServed:
        return "none"
    if none is None:
        if await _tokens(model, backend, EFFORTS[0]) is None:
            return None  # no renderer to ask: unknown
        return "low"  # the template rejects 'none'
    for effort in EFFORTS:
        if await _tokens(model, backend, effort) == none:
            return "low"
    return "none"


async def _tokens(model: str, backend: Backend, effort: str) -> list[int] | None:
    """The token ids of vLLM's probe prompt rendered with ``effort``; None when it is refused."""
    # What ChatCompletionRequest.build_chat_params makes of reasoning_effort for the template.
    kwargs = {"reasoning_effort": effort, "enable_thinking": effort != "none"}
    answer = await _post(backend, TOKENIZE_PATH, {"model": model, "chat_template_kwargs": kwargs,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
    tokens = answer.get("tokens") if answer is not None else None
    return tokens if isinstance(tokens, list) else None


# A conversation with a system message inside it, and its two chat mappings (vLLM's).
_PROBE_TURNS = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}]
_MERGED = [{"role": "system", "content": "b"}, {"role": "user", "content": "a"}, {"role": "user", "content": "c"}]


async def _probe_merge(model: str, backend: Backend) -> bool | None:
    """True (merged) or False (kept in place) when vLLM's count of the probe conversation is the
    count of exactly one of the two mappings; None otherwise; False from a chat backend (no
    ``/tokenize``: the embedded sim counts Messages over its chat, and has no template)."""
    try:
        theirs = await _post(backend, COUNT_TOKENS_PATH, {"model": model, "messages": _PROBE_TURNS})
    except _NotServed:
        try:
            await _post(backend, TOKENIZE_PATH, {"model": model, "messages": _PROBE_TURNS})
        except _NotServed:
            return False
        return None  # a renderer, but no count of vLLM's to compare with
    counts = []
    try:
        for messages in (_MERGED, _PROBE_TURNS):
            answer = await _post(backend, TOKENIZE_PATH, {"model": model, "messages": messages})
            counts.append(answer.get("count") if answer is not None else None)
    except _NotServed:
        return False  # a count but no renderer (vLLM serves both): a chat engine's Messages, as the sim's
    count = theirs.get("input_tokens") if theirs is not None else None
    if not isinstance(count, int) or counts.count(count) != 1:
        return None
    return counts.index(count) == 0


async def _post(backend: Backend, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """``body`` to ``backend``'s ``path``: its JSON object answer, or None (any other answer);
    ``_NotServed`` for a 404."""
    reply = await backend.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
    try:
        answer = orjson.loads(reply.body or b"")
    except orjson.JSONDecodeError:
        answer = None
    finally:
        reply.release()
    if path_not_served(reply.status, answer):
        raise _NotServed(path)
    return answer if reply.status == 200 and isinstance(answer, dict) else None
