"""The backend seam (``Backend``, ``BackendReply``) and its HTTP client for ``vllm`` and
``openai`` servers. vLLM's wire constants (its cache-miss answer) live in ``mmgate.wire``."""

from mmgate.backends.base import CHAT_PATH, Backend, BackendKind, BackendReply
from mmgate.backends.http import HTTPBackend, status_error

__all__ = ["CHAT_PATH", "Backend", "BackendKind", "BackendReply", "HTTPBackend", "status_error"]
