"""The OpenAI Responses API (``/v1/responses``) through the gateway, with image reuse."""

from mmgate.api.openai_responses.handlers import RESPONSES_KEY, ResponsesService, register

__all__ = ["RESPONSES_KEY", "ResponsesService", "register"]
