"""URL policy against SSRF: which image URLs the gateway may fetch. Pure logic, no sockets.

Two checks, both here:

* :meth:`UrlPolicy.check_url` — before any connection: the scheme, the host spelling (every
  numeric spelling of an address is decoded; non-canonical ones are refused outright, since
  ``inet_aton`` and ``getaddrinfo`` would read them as a different-looking address), literal
  addresses and known metadata host names.
* :meth:`UrlPolicy.check_resolved` — after DNS: every address a host name resolves to must
  pass. ``mmgate.media.dns.PolicyResolver`` calls it inside aiohttp's connector, so the
  connection goes to exactly the addresses that were checked (no DNS-rebinding window).

``allowed_private`` (IPs, CIDRs, host names) opens named destinations; cloud metadata
endpoints stay refused whatever it says. ``file:`` URLs are handled by ``check_file_url``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from yarl import URL

from mmgate.config import MediaSettings
from mmgate.errors import ForbiddenURLError
from mmgate.media.addresses import (
    METADATA_ADDRESSES,
    METADATA_HOSTNAMES,
    IPAddress,
    IPNetwork,
    blocked_reason,
    parse_legacy_ipv4,
)

log = logging.getLogger(__name__)
_EMBEDS = re.compile(r" \(embeds [^)]*\)")  # the address a resolved one embeds: not told to clients

_HINT = "open it with --allowed-private if this is intended"


@dataclass(frozen=True, slots=True)
class CheckedURL:
    """An http(s) URL that passed the pre-connection checks.

    ``url`` is the parsed yarl URL handed to aiohttp as is (so both see the same host);
    ``address`` is set when the host is a literal IP (aiohttp then skips the resolver).
    """

    url: URL
    host: str
    address: IPAddress | None


def redact_url(url: str | URL) -> str:
    """``url`` safe to show in an error: no userinfo, query replaced by ``?…``, no fragment."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<malformed URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme != "data" else "data:…"
    if len(shown) > 200:
        shown = shown[:200] + "…"
    return shown + ("?…" if parts.query else "")


class UrlPolicy:
    """Decides which destinations an image URL may reach (see the module docstring)."""

    def __init__(self, media: MediaSettings) -> None:
        nets: list[IPNetwork] = []
        names: set[str] = set()
        for item in media.allowed_private:
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                names.add(item.lower().rstrip("."))
        self._allowed_nets = tuple(nets)
        self._allowed_names = frozenset(names)
        root = media.allowed_local_media_path
        self._local_root = os.path.realpath(root) if root else None

    # -- addresses -------------------------------------------------------------------------

    def address_refusal(self, ip: IPAddress, *, host_allowed: bool = False) -> str | None:
        """Why ``ip`` may not be reached, or None. ``host_allowed``: the host name was opened."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # the socket reaches the IPv4 address: judge that one
        if ip in METADATA_ADDRESSES:
            return "a cloud metadata endpoint (always refused)"
        if host_allowed or any(ip.version == net.version and ip in net for net in self._allowed_nets):
            return None
        why = blocked_reason(ip)
        return None if why is None else f"a {why} address; {_HINT}"

    def check_resolved(self, host: str, addresses: list[IPAddress]) -> None:
        """Every address ``host`` resolved to must pass; raises ForbiddenURLError saying what kind of
        address the first that does not is — never the address itself (the client learns nothing
        of the gateway's network; the operator's log has it)."""
        if not addresses:
            raise ForbiddenURLError(f"host {host} resolved to no address")
        allowed = self.is_host_allowed(host)
        for ip in addresses:
            why = self.address_refusal(ip, host_allowed=allowed)
            if why is not None:
                log.info("refused image host %s: it resolves to %s", host, _describe(ip))
                raise ForbiddenURLError(f"refused host {host}: it resolves to {_EMBEDS.sub('', why)}")

    def is_host_allowed(self, host: str) -> bool:
        """True when the host name itself is listed in allowed_private."""
        return host.lower().rstrip(".") in self._allowed_names

    # -- URLs ------------------------------------------------------------------------------

    def check_url(self, url: str | URL, *, what: str = "image URL") -> CheckedURL:
        """Pre-connection check of an http(s) URL (also used for every redirect hop). ``what``
        names the URL in errors (``"video_url URL"`` for a video part's)."""
        shown = redact_url(url)
        try:
            parsed = url if isinstance(url, URL) else URL(url)
            host = parsed.raw_host
            port = parsed.port
        except (ValueError, TypeError) as exc:
            raise ForbiddenURLError(f"malformed {what} {shown}: {exc}") from exc
        if parsed.scheme not in ("http", "https"):
            raise ForbiddenURLError(
                f"{what} scheme {parsed.scheme or '(none)'!r} is not allowed ({shown}); "
                "use http(s) or a data: URL"
            )
        if not host:
            raise ForbiddenURLError(f"{what} {shown} has no host")
        if port is None or not 0 < port < 65536:
            raise ForbiddenURLError(f"{what} {shown} has an invalid port")
        address = self._check_host(host)
        return CheckedURL(url=parsed, host=host, address=address)

    def _check_host(self, host: str) -> IPAddress | None:
        """Check a raw host (as yarl holds it); return its address when it is a literal IP."""
        if "%" in host or ":" in host:  # IPv6 literal, maybe with a zone (fe80::1%25eth0)
            try:
                ip6 = ipaddress.IPv6Address(unquote(host).split("%", 1)[0])
            except ValueError as exc:
                raise ForbiddenURLError(f"invalid IPv6 host {host!r}") from exc
            self._refuse_address(host, ip6)
            return ip6
        try:
            ip4 = ipaddress.IPv4Address(host)
        except ValueError:
            ip4 = None
        if ip4 is not None:
            self._refuse_address(host, ip4)
            return ip4
        try:
            # A trailing dot still makes a number: getaddrinfo reads "127.1." as 127.0.0.1.
            legacy = parse_legacy_ipv4(host[:-1] if host.endswith(".") else host)
        except ValueError as exc:
            raise ForbiddenURLError(f"invalid host {host!r}: {exc}") from exc
        if legacy is not None:
            why = self.address_refusal(legacy)
            detail = f", {why}" if why else f"; write it as {legacy}"
            raise ForbiddenURLError(f"refused host {host!r}: a non-canonical spelling of {legacy}{detail}")
        name = host[:-1].lower() if host.endswith(".") else host.lower()
        if len(name) > 253 or not all(0 < len(label) < 64 for label in name.split(".")):
            # What getaddrinfo's IDNA step raises UnicodeError on: refused before any lookup.
            raise ForbiddenURLError(f"invalid host {host!r}: not a DNS name (labels of 1-63 characters, "
                                    "253 in all)")
        if name in METADATA_HOSTNAMES:
            raise ForbiddenURLError(f"refused host {host}: a cloud metadata endpoint (always refused)")
        if (name == "localhost" or name.endswith(".localhost")) and not self.is_host_allowed(name):
            raise ForbiddenURLError(f"refused host {host}: a loopback name; {_HINT}")
        return None

    def _refuse_address(self, host: str, ip: IPAddress) -> None:
        why = self.address_refusal(ip)
        if why is not None:
            raise ForbiddenURLError(f"refused host {host}: {_describe(ip)} is {why}")

    # -- file: -----------------------------------------------------------------------------

    def check_file_url(self, url: str) -> str:
        """The real path a ``file:`` URL names, when it stays inside allowed_local_media_path.

        Touches the file system (``realpath`` follows every symlink) but opens no socket.
        """
        shown = redact_url(url)
        if self._local_root is None:
            raise ForbiddenURLError(
                f"file: URLs are refused ({shown}); set --allowed-local-media-path to allow a directory"
            )
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ForbiddenURLError(f"file: URL {shown} names a remote host")
        path = unquote(parts.path)
        if not path.startswith("/") or "\x00" in path:
            raise ForbiddenURLError(f"file: URL {shown} must hold an absolute path")
        real = os.path.realpath(path)
        if os.path.commonpath([real, self._local_root]) != self._local_root:
            raise ForbiddenURLError(
                f"file: URL {shown} is outside the allowed local media directory"
            )
        return real

    def is_inside_local_root(self, real_path: str) -> bool:
        """True when an already resolved path lies inside allowed_local_media_path."""
        root = self._local_root
        return root is not None and os.path.commonpath([real_path, root]) == root



def _describe(ip: IPAddress) -> str:
    """``ip``, with the IPv4 address it maps to when it is IPv4-mapped."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"{ip} ({ip.ipv4_mapped})"
    return str(ip)
