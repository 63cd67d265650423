"""The fleet's shared secret that signs the sync's messages, read from ``--routing-sync-secret-file``
(a file, not a flag, so it never shows in a process list)."""

from __future__ import annotations

from pathlib import Path

from mmgate.errors import ConfigError
from mmgate.routing.sync.seal import MIN_SECRET_CHARS

SECRET_FLAG = "--routing-sync-secret-file"


def read_sync_secret(path: str) -> bytes:
    """The sync's secret: the file's text without surrounding whitespace, at least
    ``MIN_SECRET_CHARS`` printable ASCII characters."""
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(SECRET_FLAG, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if len(secret) < MIN_SECRET_CHARS or not secret.isascii() or not secret.isprintable():
        raise ConfigError(SECRET_FLAG, f"{path} must hold one secret of at least {MIN_SECRET_CHARS} printable "
                          "ASCII characters")
    return secret.encode()
