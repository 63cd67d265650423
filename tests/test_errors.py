"""The gateway's error tree: each error's status and OpenAI body, as the API layer sends them."""

from __future__ import annotations

import pytest

from mmgate.errors import (
    AuthenticationError,
    BackendConnectError,
    BackendStatusError,
    BackendTimeoutError,
    ForbiddenURLError,
    ImageTooLargeError,
    InvalidRequestError,
    MediaError,
    MmgateError,
    ModelNotFoundError,
    OriginError,
    OriginRefusedError,
    OriginTimeoutError,
    RequestError,
    UnknownUUIDError,
    UnsupportedImageError,
    UpstreamError,
)


@pytest.mark.parametrize(
    ("cls", "status", "code", "parent"),
    [
        (InvalidRequestError, 400, 400, RequestError),
        (AuthenticationError, 401, "invalid_api_key", RequestError),
        (ModelNotFoundError, 404, "model_not_found", RequestError),
        (ForbiddenURLError, 400, "forbidden_url", MediaError),
        (ImageTooLargeError, 400, "image_too_large", MediaError),
        (UnsupportedImageError, 400, "unsupported_image", MediaError),
        (OriginError, 502, "image_fetch_failed", MediaError),
        (OriginRefusedError, 422, "image_fetch_failed", OriginError),
        (OriginTimeoutError, 504, "image_fetch_timeout", MediaError),
        (UnknownUUIDError, 400, "unknown_image_uuid", RequestError),
        (BackendConnectError, 502, "backend_unreachable", UpstreamError),
        (BackendTimeoutError, 504, "backend_timeout", UpstreamError),
    ],
)
def test_status_code_and_body(cls: type[MmgateError], status: int, code: object, parent: type) -> None:
    err = cls("what went wrong", param="messages[0].content[1]")
    assert isinstance(err, parent) and err.status == status
    body = err.to_body()["error"]
    assert body == {"message": "what went wrong", "type": err.error_type, "param": "messages[0].content[1]",
                    "code": code}


@pytest.mark.parametrize(("backend", "client"), [(400, 400), (422, 422), (500, 502), (503, 503), (504, 504)])
def test_backend_status_is_kept_for_4xx_and_503_504(backend: int, client: int) -> None:
    err = BackendStatusError("nope", backend_status=backend)
    assert err.status == client
    assert err.error_type == ("invalid_request_error" if backend < 500 else "upstream_error")
