"""Error responses in OpenAI's shape, built in one place from the exception tree."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from mmgate.app_runtime import json_response
from mmgate.errors import BackendStatusError, MmgateError


def error_response(exc: MmgateError, headers: dict[str, str] | None = None) -> web.Response:
    """The HTTP response for ``exc``: its status and ``{"error": {message, type, param, code}}``."""
    body, headers = error_parts(exc, headers)
    return json_response(body, status=exc.status, headers=headers)


def error_parts(exc: MmgateError, headers: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The JSON body and extra headers (``Retry-After``) of ``exc``'s response."""
    body = exc.to_body()
    if isinstance(exc, BackendStatusError) and exc.body is not None and 400 <= exc.backend_status < 500:
        # A backend 4xx is the client's problem: keep the backend's own error fields.
        inner = exc.body.get("error") if isinstance(exc.body.get("error"), dict) else None
        if inner is not None:
            body = {"error": {**inner, "message": exc.message}}
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(retry_after)}
    return body, headers


def error_frame(exc: MmgateError) -> bytes:
    """An SSE frame carrying an error, for failures after a stream has started."""
    return b"data: " + orjson.dumps(exc.to_body()) + b"\n\n"


def http_error_response(exc: web.HTTPException) -> web.Response:
    """aiohttp's own HTTP errors (413 body too large, 405, 404 route) in OpenAI's shape."""
    error_type = "invalid_request_error" if exc.status < 500 else "internal_error"
    body = {"error": {"message": exc.reason, "type": error_type, "param": None, "code": exc.status}}
    return json_response(body, status=exc.status)
