"""The agent-facing APIs beside chat completions: Anthropic Messages and OpenAI Responses.

``register(app, gateway)`` is the one call ``mmgate.api.app.build_app`` makes for them.
"""

from __future__ import annotations

from aiohttp import web

from mmgate.api import anthropic, openai_responses
from mmgate.api.gateway import Gateway


def register(app: web.Application, gateway: Gateway) -> None:
    """Add ``/v1/responses*`` and ``/v1/messages*`` to ``app``."""
    openai_responses.register(app, gateway)
    anthropic.register(app, gateway)
