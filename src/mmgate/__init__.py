"""mmgate: a multimodal-aware gateway for OpenAI-compatible LLM serving (vLLM first).

See docs/ARCHITECTURE.md for the architecture. Components live in one subpackage each:
``api`` (HTTP surface), ``media`` (image loading and caches), ``reuse`` (UUID namespacing,
store, strip and heal), ``routing`` (backend choice), ``backends`` (vllm/openai clients),
``sim`` (embedded vLLM-like engine) and ``bench`` (the multimodal session benchmark).
"""

__version__ = "0.1.0"
