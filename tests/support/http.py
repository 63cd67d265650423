"""A JSON POST to a chat endpoint (gateway or engine), shared by the tests."""

from __future__ import annotations

from typing import Any, NamedTuple

import aiohttp

CHAT_PATH = "/v1/chat/completions"


class Reply(NamedTuple):
    """What the server answered: status, decoded JSON body (None if not JSON), headers."""

    status: int
    body: Any
    headers: dict[str, str]


async def post(
    url: str, body: Any, headers: dict[str, str] | None = None, *, session: aiohttp.ClientSession | None = None
) -> Reply:
    """POST ``body`` as JSON to ``url`` + /v1/chat/completions (in ``session`` when given)."""
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await post(url, body, headers, session=own)
    async with session.post(url + CHAT_PATH, json=body, headers=headers or {}) as r:
        try:
            decoded = await r.json(content_type=None)
        except ValueError:  # not JSON (an aiohttp error page): the status tells the story
            decoded = None
        return Reply(r.status, decoded, dict(r.headers))
