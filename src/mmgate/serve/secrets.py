"""Secrets read from files at start-up and on reload: the tenants' API keys, the backends' API
keys and the operator's admin key.

Files, not flags, so a key never shows in a process list; a bad file fails start-up (and a reload
keeps the old keys) with a ``ConfigError`` naming its flag and the file. A file that holds no key
is bad: an empty API keys file would answer 401 to every tenant, an empty backend keys file send
every backend none (a file truncated by a deploy that failed half-way looks just like that).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from mmgate._settings import ConfigError
from mmgate.config import BackendSpec
from mmgate.reuse import TenantKeys

# Shortest admin key accepted: it opens every backend's operator endpoints.
MIN_ADMIN_KEY = 16


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc


def read_tenant_keys(path: str) -> TenantKeys:
    """The tenants' API keys (``TenantKeys.from_file``); a file with none is refused."""
    tenants = TenantKeys.from_file(path)
    if not len(tenants):
        raise ConfigError("--api-keys-file", f"{path} holds no API key (every request would get 401); "
                          "to turn authentication off, leave --api-keys-file unset and restart")
    return tenants


def read_admin_key(path: str) -> str:
    """The operator's key: the file's text without surrounding whitespace, at least 16 characters."""
    key = _read(path, "--admin-key-file").strip()
    if len(key) < MIN_ADMIN_KEY or not key.isascii() or not key.isprintable():
        raise ConfigError("--admin-key-file", f"{path} must hold one key of at least {MIN_ADMIN_KEY} printable "
                          "ASCII characters")
    return key


def read_backend_keys(path: str, specs: Sequence[BackendSpec]) -> dict[str, str]:
    """Each backend's API key by its URL: a JSON object or 'BACKEND KEY' lines (``#`` comments),
    BACKEND a backend URL as given to ``--backend`` or a backend's name (``vllm-0``: kind and
    position). A BACKEND that names no
    configured backend fails start-up (a typo would otherwise send no key)."""
    flag = "--backend-keys-file"
    text = _read(path, flag)
    entries: dict[str, str] = {}
    if text.lstrip().startswith("{"):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(flag, f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or not all(isinstance(v, str) and v for v in data.values()):
            raise ConfigError(flag, f"{path} must map each backend URL or name to a key")
        entries = {str(k): v for k, v in data.items()}
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if len(fields) != 2:
                raise ConfigError(flag, f"{path}:{number}: expected 'BACKEND KEY'")
            entries[fields[0]] = fields[1]
    keys: dict[str, str] = {}
    for backend, key in entries.items():
        match = [s for i, s in enumerate(specs)
                 if s.url == backend.rstrip("/") or (s.name or f"{s.kind}-{i}") == backend]
        if not match:
            raise ConfigError(flag, f"{path}: {backend!r} is no configured --backend (its URL or name)")
        for spec in match:
            keys[spec.url] = key
    if not keys:
        raise ConfigError(flag, f"{path} holds no backend key")
    return keys
