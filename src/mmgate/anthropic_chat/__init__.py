"""Anthropic Messages mapped onto chat completions and back, as vLLM 0.32 maps them internally
(``vllm/entrypoints/anthropic/``): the request's checks (``checks``), the chat request it becomes
(``request``), the message a chat completion becomes (``reply``) and the events a chat stream
becomes (``stream``). Pure logic, shared by the gateway (``mmgate.api.anthropic``, which maps a
request onto its backends' chat endpoint so its images are reused) and the embedded engine
(``mmgate.sim``, which serves ``/v1/messages`` over its own chat, as vLLM does)."""

from mmgate.anthropic_chat.checks import check_messages_body
from mmgate.anthropic_chat.reply import message_from_chat
from mmgate.anthropic_chat.request import forward_reason, to_chat_body
from mmgate.anthropic_chat.stream import StreamMapper

__all__ = ["StreamMapper", "check_messages_body", "forward_reason", "message_from_chat", "to_chat_body"]
