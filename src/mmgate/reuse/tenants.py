"""API keys → tenants. With keys configured, every request must carry a known key: in
``Authorization: Bearer <key>``, as OpenAI's clients and vLLM's send it, or in ``x-api-key: <key>``,
as Anthropic's clients do (an agent on the Messages API points its SDK at the gateway unchanged).
A request with both is judged by ``Authorization``.

Keys come from a file (``--api-keys-file``, or ``MMGATE_API_KEYS_FILE``: a JSON object
``{"key": "tenant"}`` or lines ``key tenant``). Keys are held as SHA-256 digests and compared in
constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import orjson

from mmgate.errors import AuthenticationError, ConfigError


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantKeys:
    """Resolves a request's API key (``Authorization: Bearer <key>`` or ``x-api-key``) to a tenant name."""

    def __init__(self, keys: dict[str, str]) -> None:
        for key, tenant in keys.items():
            if not key or not tenant:
                raise ConfigError("--api-keys-file", "every API key needs a non-empty key and tenant")
        self._by_digest = {_digest(k): t for k, t in keys.items()}

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def from_file(cls, path: str) -> TenantKeys:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("--api-keys-file", f"cannot read {path}: {exc.strerror}") from exc
        if text.lstrip().startswith("{"):
            try:
                data = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise ConfigError("--api-keys-file", f"{path} is not valid JSON: {exc}") from exc
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise ConfigError("--api-keys-file", f"{path} must map each key to a tenant name")
            return cls({str(k): v for k, v in data.items()})
        keys: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2:
                raise ConfigError("--api-keys-file", f"{path}:{number}: expected 'KEY TENANT'")
            keys[fields[0]] = fields[1]
        return cls(keys)

    def tenant_for(self, authorization: str | None, api_key: str | None = None) -> str:
        """The tenant of a request's ``Authorization`` header, else of its ``x-api-key`` header;
        AuthenticationError (401) otherwise."""
        if authorization:
            if not authorization.isascii() or not authorization.isprintable():
                raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>' in ASCII")
            scheme, _, key = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise AuthenticationError("malformed Authorization header: expected 'Bearer <key>'")
        elif api_key:
            if not api_key.isascii() or not api_key.isprintable() or not api_key.strip():
                raise AuthenticationError("malformed x-api-key header: expected the key in ASCII")
            key = api_key
        else:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')")
        digest = _digest(key.strip())
        found: str | None = None
        for known, tenant in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                found = tenant
        if found is None:
            raise AuthenticationError("invalid API key")
        return found
