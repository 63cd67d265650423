"""The gateway's HTTP surface: request parsing (``parse``), the pipeline (``gateway``), the
aiohttp handlers (``app``) and error responses (``responses``)."""

from mmgate.api.app import build_app
from mmgate.api.gateway import ChatOutcome, Gateway
from mmgate.api.parse import ChatRequest, parse_chat_request

__all__ = ["ChatOutcome", "ChatRequest", "Gateway", "build_app", "parse_chat_request"]
