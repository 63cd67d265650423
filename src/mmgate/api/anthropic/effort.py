"""Which reasoning effort ``thinking: {"type": "disabled"}`` means on a model's replicas, found the
way vLLM finds it (``AnthropicServingMessages._probe_disabled_thinking_effort``): render a probe
prompt with each effort and compare. ``none`` unless the chat template rejects it or renders it as
some effort, then ``low``. The gateway renders on a replica's ``/tokenize`` (vLLM's own renderer and
template, given the template arguments a chat request's ``reasoning_effort`` becomes:
``reasoning_effort`` and ``enable_thinking``; ``/v1/chat/completions/render`` would be the direct
way, but vLLM serves it only with ``--enable-scale-out``), so such a request can be mapped onto
chat (and its repeated images stripped) instead of going to vLLM's ``/v1/messages`` as it is.

One probe per model at a time (concurrent requests wait for it), its answer kept ``TTL_S``; a
replica that cannot render (an older vLLM, a failure) answers nothing, and the request is then
forwarded as before. Bounded: ``MAX_MODELS`` models known and probed at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from mmgate.backends import Backend
from mmgate.errors import MmgateError

RENDER_PATH = "/tokenize"
# vLLM's efforts, probed in its order (``AnthropicEffort``).
EFFORTS = ("low", "medium", "high", "xhigh", "max")
TTL_S = 300.0
PROBE_TIMEOUT_S = 5.0
# Models remembered, and probed at once, at most (a fleet serves a few; before any backend has
# answered, a client names any model it likes).
MAX_MODELS = 64

log = logging.getLogger(__name__)


class DisabledThinking:
    """Per model: the effort ``thinking: disabled`` maps to, or None (not known: forward)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[float, str | None]] = {}
        self._probes: dict[str, asyncio.Task[str | None]] = {}

    async def effort(self, model: str, backend: Backend) -> str | None:
        """The effort for ``model``, probed on ``backend`` when not known (or known too long)."""
        known = self._known.get(model)
        if known is not None and time.monotonic() - known[0] < TTL_S:
            return known[1]
        probe = self._probes.get(model)
        if probe is None:
            if len(self._probes) >= MAX_MODELS:
                return None  # forwarded as it is
            probe = self._probes[model] = asyncio.create_task(_probe(model, backend), name="mmgate-thinking-probe")
            probe.add_done_callback(lambda done: self._settle(model, done))
        return await asyncio.shield(probe)

    def _settle(self, model: str, probe: asyncio.Task[str | None]) -> None:
        self._probes.pop(model, None)
        if not probe.cancelled() and probe.exception() is None:
            if model not in self._known and len(self._known) >= MAX_MODELS:
                del self._known[next(iter(self._known))]  # the longest known
            self._known[model] = (time.monotonic(), probe.result())
            # vLLM logs its own probe's answer in these words.
            log.info("Anthropic thinking.type=disabled maps to reasoning_effort=%r for model %r "
                     "(None: unknown, forwarded as it is)", probe.result(), model)


async def _probe(model: str, backend: Backend) -> str | None:
    """vLLM's probe on ``backend``; None when the replica cannot render at all."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            none = await _render(model, backend, "none")
            if none is None:
                if await _render(model, backend, EFFORTS[0]) is None:
                    return None  # no renderer to ask: unknown
                return "low"  # the template rejects 'none'
            for effort in EFFORTS:
                if await _render(model, backend, effort) == none:
                    return "low"
            return "none"
    except (TimeoutError, MmgateError):
        return None


async def _render(model: str, backend: Backend, effort: str) -> list[int] | None:
    """The token ids of vLLM's probe prompt rendered with ``effort``; None when it is refused."""
    # What ChatCompletionRequest.build_chat_params makes of reasoning_effort for the template.
    kwargs = {"reasoning_effort": effort, "enable_thinking": effort != "none"}
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}],
                         "chat_template_kwargs": kwargs})
    reply = await backend.request("POST", RENDER_PATH, body=body, headers={"Content-Type": "application/json"})
    try:
        if reply.status != 200:
            return None
        ids = orjson.loads(reply.body or b"{}").get("tokens")
        return ids if isinstance(ids, list) else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    finally:
        reply.release()
