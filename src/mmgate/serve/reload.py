"""SIGHUP: read the settings again (the ``--config`` file, ``MMGATE_*`` variables, flags) and apply
those a running gateway can change without dropping a request: the static ``--backend`` list, the
API keys (``--api-keys-file``) and the tenant secret.

Everything is read and checked before anything is applied, so a bad file (bad TOML, an empty
config file, an unknown setting, an unreadable, malformed or empty keys file) keeps every old
value and logs an ERROR naming it. A reload never turns authentication off: a gateway started
with API keys that reloads to none keeps its keys until a restart says so. Requests in
flight finish with what they started with: a backend that leaves is closed only after the drain
time, and a request keeps the key space it was planned in. Other settings that changed are named
in the log as needing a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import Counter

from mmgate._settings import ConfigError
from mmgate.config import GatewaySettings
from mmgate.reuse import KeySpace, TenantKeys
from mmgate.serve.engines import embedded_defaults
from mmgate.serve.secrets import read_backend_keys, read_tenant_keys
from mmgate.serve.start import RunningGateway, backend_factory

log = logging.getLogger(__name__)

# The settings a reload applies; any other change waits for a restart.
RELOADABLE = frozenset({"backends", "api_keys_file", "tenant_secret", "backend_keys_file"})


class Reloader:
    """Applies a re-read of the settings to a running gateway; ``schedule()`` is the SIGHUP
    handler (a signal during a reload runs one more after it, never two at once)."""

    def __init__(self, running: RunningGateway, read_settings: Callable[[], GatewaySettings]) -> None:
        self._running = running
        self._read = read_settings
        self._settings = running.gateway.settings
        self._keys = running.gateway.keys
        self._backend_keys = running.backend_keys
        self._task: asyncio.Task[bool] | None = None
        self._again = False
        self.reloads = Counter("mmgate_reloads_total", "Settings reloads (SIGHUP) by result: applied, or refused "
                               "(the old settings kept)", ["result"], registry=running.gateway.metrics.registry)

    def schedule(self) -> None:
        """Reload soon (from a signal handler): now, or after the reload under way."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> bool:
        applied = await self.reload()
        while self._again:
            self._again = False
            applied = await self.reload()
        return applied

    async def reload(self) -> bool:
        """Read and apply; False (and the old values kept, the reason logged) when anything is bad."""
        running = self._running
        if running.gateway.stopping:
            log.warning("reload ignored: the gateway is shutting down")
            return False
        try:
            # Files are read in a thread: a slow volume must not hold the event loop.
            new, tenants, backend_keys = await asyncio.to_thread(self._read_all)
            if tenants is None and running.gateway.tenants is not None:
                raise ConfigError("--api-keys-file", "the reloaded settings name no API keys file: turning "
                                  "authentication off needs a restart")
        except ConfigError as exc:
            self.reloads.labels("refused").inc()
            log.error("reload refused, the old settings stay: %s", exc.message)
            return False
        if running.embedded and (new.backends or new.backend_dns):
            log.warning("reload: the gateway runs embedded engines; --backend takes effect at a restart")
        if running.embedded:
            new = embedded_defaults(new)
        old = self._settings
        keys = self._keys
        if new.tenant_secret != old.tenant_secret:
            keys = KeySpace(new.tenant_secret.encode() if new.tenant_secret else None)
        running.gateway.reconfigure(tenants=tenants, keys=keys)
        if not running.embedded:
            await running.discovery.set_static(new.backends, backend_factory(new, backend_keys),
                                               rebuild=backend_keys != self._backend_keys)
        changed = sorted(name for name in type(new).model_fields
                         if name not in RELOADABLE and getattr(new, name) != getattr(old, name))
        if changed:
            log.warning("reload: changed settings that need a restart, not applied: %s", ", ".join(changed))
        self._settings, self._keys, self._backend_keys = new, keys, backend_keys
        self.reloads.labels("applied").inc()
        log.info("reloaded: %d backend(s), %s, tenant secret %s", len(running.discovery.backends),
                 f"{len(tenants)} API key(s)" if tenants is not None else "no API keys",
                 "changed" if new.tenant_secret != old.tenant_secret else "unchanged")
        return True

    def _read_all(self) -> tuple[GatewaySettings, TenantKeys | None, dict[str, str]]:
        new = self._read()
        if not self._running.embedded and not new.backends and not new.backend_dns:
            raise ConfigError("--backend", "the reloaded settings name no backend (no --backend, no --backend-dns)")
        tenants = read_tenant_keys(new.api_keys_file) if new.api_keys_file else None
        backend_keys = (read_backend_keys(new.backend_keys_file, [*new.backends, *new.backend_dns])
                        if new.backend_keys_file else {})
        return new, tenants, backend_keys
