"""The gateway's HTTP surface: request parsing (``parse``), the chat pipeline (``gateway``), the
route table (``app``), vLLM's other endpoints (``endpoints``, media policed by ``police``), the
forwarding seam they and other front ends share (``forward``), operator endpoints (``admin``) and
error responses (``responses``)."""

from mmgate.api.app import build_app
from mmgate.api.chat_request import ChatRequest, parse_chat_request
from mmgate.api.forward import Forwarder, Upload, deliver
from mmgate.api.gateway import ChatOutcome, Gateway

__all__ = [
    "ChatOutcome", "ChatRequest", "Forwarder", "Gateway", "Upload", "build_app", "deliver",
    "parse_chat_request",
]
