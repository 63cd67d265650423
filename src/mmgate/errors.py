"""The one exception tree of mmgate.

Every error knows the HTTP status and the OpenAI error ``type``/``code`` it maps to, so the API
layer turns any of them into a response in one place (``mmgate.api.error_responses.error_response``).
Third-party exceptions (aiohttp, redis, Pillow) are translated at the module that calls them and
never escape it.

Where vLLM answers the same fault itself, the status is vLLM's class, so a client's SDK raises the
same exception through the gateway as against vLLM (``tests/vllm/test_error_classes.py``): media
that does not decode is 400 (``BadRequestError``), an origin's 404 is 422 (vLLM's
``UnprocessableEntityError``), an origin that fails transiently is a 5xx (vLLM: 500; here 502/504,
a gateway's "the server behind me failed"), and a backend's 500 is 502 on every endpoint
(``relayed_status``).

    MmgateError
    ├── RequestError                  client's fault → 4xx
    │   ├── InvalidRequestError       400: malformed body, bad part shape, bad uuid, too many images
    │   ├── AuthenticationError       401: missing or unknown API key
    │   ├── ModelNotFoundError        404: model no backend serves
    │   ├── ResponseNotFoundError     404: a stored response no backend holds
    │   ├── MediaError                the image the client pointed at is unusable
    │   │   ├── ForbiddenURLError     400: URL policy (SSRF) refused the destination
    │   │   ├── ImageTooLargeError    400: over the byte or pixel limit
    │   │   ├── UnsupportedImageError 400: not an image / format not allowed / truncated
    │   │   ├── OriginError           502: origin failed (5xx, 408, 429), refused, DNS failure
    │   │   │   └── OriginRefusedError 422: origin answered another 4xx; a local file that is not there
    │   │   └── OriginTimeoutError    504: origin too slow
    │   ├── UnknownUUIDError          400: cache-only reference nobody holds
    │   ├── BodyTooLargeError         413: request body over --max-body-bytes
    │   ├── BodyTimeoutError          408: request body not received within --body-timeout
    │   ├── UnsupportedEncodingError  415: a compressed request body the gateway does not accept
    │   ├── BusyError                 429: the decode queue is full (Retry-After)
    │   │   ├── TenantLimitError      429: the tenant's requests in flight are at --max-tenant-requests
    │   │   ├── CacheShareError       429: the tenant's new images past its share of a backend's cache
    │   │   └── TenantConnectionsError 429: the tenant holds its share of a backend's connections
    │   ├── ForbiddenError            403: an operator endpoint without the admin key
    │   └── EndpointNotFoundError     404/405: a path or method the gateway does not serve
    ├── ShuttingDownError             503: the gateway stopped before the request finished
    ├── UpstreamError                 backend trouble → 5xx (or the backend's own 4xx)
    │   ├── BackendStatusError        the backend's own status and message, passed through
    │   ├── BackendConnectError       502
    │   ├── BackendBusyError          503: every pool connection to it in use (not a failure)
    │   ├── BackendProtocolError      502
    │   └── BackendTimeoutError       504
    └── CacheError                    shared-cache trouble: always swallowed (fail-open)

``ConfigError`` (a bad setting: fails start-up, names the setting) is not in this tree: it never
reaches a client. ``mmgate._settings`` re-exports it; it is defined here so that this module
imports nothing of mmgate's (an image decode process imports it, and not pydantic).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError", "BackendBusyError", "BackendConnectError", "BackendProtocolError", "BackendStatusError",
    "BackendTimeoutError", "BodyTimeoutError", "BodyTooLargeError", "BusyError", "CacheError", "CacheShareError", "ConfigError",
    "EndpointNotFoundError", "ForbiddenError", "ForbiddenURLError", "ImageTooLargeError", "InvalidRequestError",
    "MediaError", "MmgateError", "ModelNotFoundError", "OriginError", "OriginRefusedError", "OriginTimeoutError",
    "RequestError",
    "ResponseNotFoundError", "ShuttingDownError", "TenantConnectionsError", "TenantLimitError", "UnknownUUIDError", "UnsupportedEncodingError",
    "UnsupportedImageError", "UpstreamError", "origin_status_error", "relayed_status",
]


class ConfigError(Exception):
    """A setting is invalid: start-up fails with a message naming it (exit status 2)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = f"{setting}: {message}"


class MmgateError(Exception):
    """Root of every mmgate error."""

    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict[str, Any]:
        """The OpenAI-style error body for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }


class RequestError(MmgateError):
    """The client's request is at fault (4xx)."""

    status = 400
    error_type = "invalid_request_error"


class InvalidRequestError(RequestError):
    """Malformed body or a request field that breaks the contract."""


class AuthenticationError(RequestError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFoundError(RequestError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ResponseNotFoundError(RequestError):
    """A Responses API id (``GET``/``cancel``, ``previous_response_id``) that no backend holds."""

    status = 404
    code = "response_not_found"


class MediaError(RequestError):
    """An image the request points at cannot be used."""


class ForbiddenURLError(MediaError):
    code = "forbidden_url"


class ImageTooLargeError(MediaError):
    code = "image_too_large"


class UnsupportedImageError(MediaError):
    """Not an image in an allowed format, or corrupt: vLLM's 400 for media it cannot load."""

    status = 400
    code = "unsupported_image"


class OriginError(MediaError):
    """The origin failed the way vLLM counts as transient (a 5xx, 408 or 429 answer, a refused
    connection, a DNS failure, a broken reply): a 5xx, as vLLM's own 500, so clients retry it."""

    status = 502
    error_type = "upstream_error"
    code = "image_fetch_failed"


class OriginRefusedError(OriginError):
    """The origin answered a 4xx other than 408/429 (or a local file is not there): the media
    resource is invalid, vLLM's 422."""

    status = 422
    error_type = "invalid_request_error"


def origin_status_error(status: int, message: str) -> OriginError:
    """The error for an origin's non-2xx ``status``, classed as vLLM classes it."""
    if 400 <= status < 500 and status not in (408, 429):
        return OriginRefusedError(message)
    return OriginError(message)


class OriginTimeoutError(MediaError):
    """The origin (or its DNS) was too slow: a 5xx, as vLLM's 500 for a fetch time-out."""

    status = 504
    error_type = "upstream_error"
    code = "image_fetch_timeout"


class UnknownUUIDError(RequestError):
    """A cache-only reference to a uuid that neither the backend nor the gateway holds."""

    code = "unknown_image_uuid"


class BodyTooLargeError(RequestError):
    status = 413
    code = "request_too_large"


class BodyTimeoutError(RequestError):
    status = 408
    code = "request_timeout"


class UnsupportedEncodingError(RequestError):
    """A request body with a ``Content-Encoding`` the gateway does not accept (or whose inflation
    would cross its limits)."""

    status = 415
    code = "unsupported_content_encoding"


class BusyError(RequestError):
    """Too much work queued (image decodes): come back later. Answered with ``Retry-After``."""

    status = 429
    error_type = "rate_limit_error"
    code = "gateway_busy"
    retry_after_s = 1


class TenantLimitError(BusyError):
    """The tenant already has ``--max-tenant-requests`` requests in flight (streams included)."""

    code = "tenant_request_limit"


class TenantConnectionsError(BusyError):
    """The tenant's requests already hold its share of a backend's connections (half of
    ``--backend-max-connections``, ``mmgate.backends.tenant_share``): the rest stays for the other
    tenants, so one that never reads its streams cannot make them wait."""

    code = "tenant_backend_connections"


class CacheShareError(BusyError):
    """The tenant's new images would take it past its share of a backend's processor cache
    (``mmgate.reuse.cache_share``); ``retry_after_s``: when enough of its sends have aged out."""

    code = "tenant_cache_share"

    def __init__(self, message: str, *, retry_after_s: int, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class ForbiddenError(RequestError):
    """An operator endpoint asked for without the operator's admin key."""

    status = 403
    error_type = "permission_error"
    code = "admin_key_required"


class EndpointNotFoundError(RequestError):
    """A path (or a method on it) the gateway does not serve."""

    status = 404
    code = "unknown_endpoint"


class ShuttingDownError(MmgateError):
    """The gateway is stopping and cut this request after its drain time."""

    status = 503
    error_type = "server_error"
    code = "shutting_down"


class UpstreamError(MmgateError):
    """A backend failed."""

    status = 502
    error_type = "upstream_error"


def relayed_status(backend_status: int) -> int:
    """The status the client gets for a backend's error ``backend_status``, on every endpoint: a
    4xx and 503/504 kept, any other 5xx 502 (the gateway did not fail; SDKs treat both as a
    retryable server error)."""
    if backend_status < 500 or backend_status in (503, 504):
        return backend_status
    return 502


class BackendStatusError(UpstreamError):
    """A backend answered with an error status; its status (``relayed_status``) and message are
    passed through."""

    def __init__(
        self, message: str, *, backend_status: int, body: dict[str, Any] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.backend_status = backend_status
        self.body = body
        self.status = relayed_status(backend_status)
        if 400 <= backend_status < 500:
            self.error_type = "invalid_request_error"


class BackendConnectError(UpstreamError):
    status = 502
    code = "backend_unreachable"


class BackendBusyError(UpstreamError):
    """Every connection the gateway may open to the backend is in use (``--backend-max-connections``)
    and none came free within the connect timeout: the backend is busy, not failing — never a
    reason to eject it. Answered 503 with ``Retry-After``."""

    status = 503
    code = "backend_busy"
    retry_after_s = 1


class BackendProtocolError(UpstreamError):
    status = 502
    code = "backend_protocol_error"


class BackendTimeoutError(UpstreamError):
    status = 504
    code = "backend_timeout"


class CacheError(MmgateError):
    """Shared-cache trouble. Never reaches a client: callers fail open."""
