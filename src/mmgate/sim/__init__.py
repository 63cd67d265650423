"""The embedded vLLM-like engine (``mmgate sim``): a stand-in for vLLM, not a model.

It behaves like vLLM where mmgate cares — the multimodal processor cache keyed by uuid or content
hash, UUID-only references and vLLM's cache-miss error, real per-image processing on a miss, a
token-timing model, vLLM's wire format for chat completions and the Responses API, Prometheus
counters — so the gateway, its tests and the benchmark can run without a GPU. Start one with
``start_sim(SimSettings(...))``.
"""

from mmgate.sim.config import SimSettings
from mmgate.sim.errors import SimError
from mmgate.sim.server import SimServer, start_sim

__all__ = ["SimError", "SimServer", "SimSettings", "start_sim"]
