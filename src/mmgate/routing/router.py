"""Backend choice: session affinity by rendezvous hash, round robin otherwise.

Backends are grouped by the models they serve (learnt from their ``/v1/models``). Client uuids are
never routing keys.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

from mmgate.backends.base import Backend
from mmgate.errors import MmgateError, ModelNotFoundError
from mmgate.routing.rendezvous import rendezvous_pick

log = logging.getLogger(__name__)


class Router:
    """Picks a backend for (model, session)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise ValueError("at least one backend is required")
        self.backends = list(backends)
        self._models: dict[str, list[Backend]] = {}
        self._answered = False
        self._rr = itertools.count()

    @property
    def models(self) -> list[str]:
        return sorted(self._models)

    async def refresh_models(self) -> None:
        """Ask every backend which models it serves (unreachable ones keep their last answer)."""
        results = await asyncio.gather(*(b.models() for b in self.backends), return_exceptions=True)
        models: dict[str, list[Backend]] = {}
        previous = {b.name: [m for m, bs in self._models.items() if b in bs] for b in self.backends}
        for backend, result in zip(self.backends, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, MmgateError):
                    raise result
                log.warning("model refresh failed for %s: %s", backend.name, result.message)
                served = previous.get(backend.name, [])
            else:
                self._answered = True
                served = result
            for model in served:
                models.setdefault(model, []).append(backend)
        self._models = models

    def candidates(self, model: str) -> list[Backend]:
        found = self._models.get(model)
        if found:
            return found
        if not self._answered:
            # No backend has ever answered: send it on, so the client sees the real failure (502/504).
            return self.backends
        raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")

    def pick(self, model: str, session_id: str | None) -> Backend:
        candidates = self.candidates(model)
        if len(candidates) == 1:
            return candidates[0]
        if session_id is not None:
            return candidates[rendezvous_pick(session_id, [b.name for b in candidates])]
        return candidates[next(self._rr) % len(candidates)]

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b in self.backends), return_exceptions=True)
