"""The Anthropic Messages API (``/v1/messages``) through the gateway, mapped onto chat completions
so that images are reused."""

from mmgate.api.anthropic.handlers import PATHS, MessagesService, error_response, register

__all__ = ["PATHS", "MessagesService", "error_response", "register"]
