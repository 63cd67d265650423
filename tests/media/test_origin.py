"""Origin fetches against a real aiohttp origin on 127.0.0.1: policy, redirects, caps, timeouts."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mmgate.config import MediaSettings
from mmgate.errors import (
    ForbiddenURLError,
    ImageTooLargeError,
    OriginError,
    OriginTimeoutError,
    UnsupportedImageError,
)
from mmgate.media.dns import PolicyResolver
from mmgate.media.loader import MediaLoader
from mmgate.media.url_policy import UrlPolicy
from tests.media.conftest import LoaderFactory
from tests.support.images import data_url, make_image, truncated
from tests.support.origin import ImageOrigin
from tests.support.ports import free_port

MiB = 1024 * 1024


async def test_loopback_origin_refused_by_default(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    loader = make_loader(media={"allowed_private": ()})
    with pytest.raises(ForbiddenURLError, match="loopback") as info:
        await loader.load(url, param="messages[0].content[1]")
    assert info.value.status == 400 and info.value.param == "messages[0].content[1]"
    assert origin.hits["/img/a.png"] == 0


async def test_loopback_origin_allowed_through_allowed_private(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    url = origin.add("a.png", make_image("PNG", 30, 20))
    image = await make_loader().load(url)
    assert (image.mime, image.width, image.height) == ("image/png", 30, 20)
    assert origin.hits["/img/a.png"] == 1


@pytest.mark.parametrize("target", ["http://127.0.0.2:{port}/img/a.png", "http://[::1]:{port}/img/a.png",
                                    "http://localhost:{port}/img/a.png", "http://2130706433:{port}/img/a.png",
                                    "file:///etc/passwd"])
async def test_redirect_to_a_refused_destination(
    origin: ImageOrigin, make_loader: LoaderFactory, target: str
) -> None:
    origin.add("a.png", make_image("PNG"))
    url = origin.url("/redirect?to=" + target.format(port=origin.port))
    with pytest.raises(ForbiddenURLError, match="redirected to"):
        await make_loader().load(url)
    assert origin.hits["/redirect"] == 1 and origin.hits["/img/a.png"] == 0


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_redirects_within_the_limit_are_followed(
    origin: ImageOrigin, make_loader: LoaderFactory, code: int
) -> None:
    origin.add("a.png", make_image("PNG"))
    url = origin.url(f"/redirect?code={code}&to=/chain/2/a.png")
    image = await make_loader(media={"max_redirects": 3}).load(url)
    assert image.width == 64
    assert origin.hits["/img/a.png"] == 1


async def test_too_many_redirects(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader(media={"max_redirects": 2})
    await loader.load(origin.url("/chain/2/a.png"))
    with pytest.raises(OriginError, match="too many redirects"):
        await loader.load(origin.url("/chain/3/a.png"))
    assert origin.hits["/chain/1/a.png"] == 2 and origin.hits["/chain/0/a.png"] == 0
    with pytest.raises(OriginError, match="too many redirects"):
        await make_loader(media={"max_redirects": 0}).load(origin.url("/chain/1/a.png"))


async def test_redirect_without_location(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    with pytest.raises(OriginError, match="without a Location"):
        await make_loader().load(origin.url("/no-location"))


@pytest.mark.parametrize(("code", "status"), [(404, 422), (403, 422), (429, 502), (500, 502), (503, 502)])
async def test_origin_error_status_is_vllms_class_naming_it(
    origin: ImageOrigin, make_loader: LoaderFactory, code: int, status: int
) -> None:
    """vLLM's classes: an origin 4xx (not 408/429) is 422, the rest a 5xx (vLLM: 500)."""
    with pytest.raises(OriginError, match=f"HTTP {code}") as info:
        await make_loader().load(origin.url(f"/status/{code}?token=hidden"), param="p")
    assert info.value.status == status and info.value.code == "image_fetch_failed"
    assert "hidden" not in info.value.message and f"/status/{code}" in info.value.message


async def test_non_200_success_is_refused(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    with pytest.raises(OriginError, match="204"):
        await make_loader().load(origin.url("/status/204"))


async def test_connection_refused(make_loader: LoaderFactory) -> None:
    port = free_port()  # nothing listens there now
    with pytest.raises(OriginError, match="could not connect") as info:
        await make_loader().load(f"http://127.0.0.1:{port}/a.png")
    assert info.value.status == 502


async def test_slow_headers_time_out_with_504(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader(media={"read_timeout_s": 0.3, "total_timeout_s": 20})
    with pytest.raises(OriginTimeoutError, match=r"sent nothing for 0\.3s") as info:
        await loader.load(origin.url("/slow-headers/a.png"))
    assert info.value.status == 504


async def test_stalled_body_times_out_with_408(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader(media={"read_timeout_s": 0.3, "total_timeout_s": 20})
    with pytest.raises(OriginTimeoutError):
        await loader.load(origin.url("/slow-body/a.png"))


async def test_total_timeout_spans_the_whole_fetch(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader(media={"read_timeout_s": 10, "total_timeout_s": 0.3})
    with pytest.raises(OriginTimeoutError, match=r"longer than 0\.3s"):
        await loader.load(origin.url("/slow-headers/a.png"))


async def test_oversize_stream_is_abandoned_early(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    total = 512 * MiB
    registry = CollectorRegistry()
    loader = make_loader(media={"max_image_bytes": 1 * MiB}, registry=registry)
    with pytest.raises(ImageTooLargeError, match="download stopped"):
        await loader.load(origin.url(f"/big?size={total}"))
    await asyncio.wait_for(origin.big_done.wait(), 30)
    assert origin.big_sent is not None
    # The cap plus what socket buffers absorbed; far from the whole body.
    assert origin.big_sent < 64 * MiB, origin.big_sent
    received = registry.get_sample_value("mmgate_origin_bytes_total")
    assert received is not None and MiB < received <= MiB + 128 * 1024


async def test_declared_oversize_is_refused_before_reading(
    origin: ImageOrigin, make_loader: LoaderFactory
) -> None:
    registry = CollectorRegistry()
    loader = make_loader(media={"max_image_bytes": 1 * MiB}, registry=registry)
    with pytest.raises(ImageTooLargeError, match=f"is {2 * MiB} bytes"):
        await loader.load(origin.url(f"/big?size={2 * MiB}&declare=1"))
    assert registry.get_sample_value("mmgate_origin_bytes_total") == 0


async def test_truncated_image_from_origin_is_400(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("cut.jpg", truncated(make_image("JPEG", 200, 200)), "image/jpeg")
    loader = make_loader()
    with pytest.raises(UnsupportedImageError):
        await loader.load(url)
    assert len(loader.local) == 0


class ScriptedDNS:
    """A scripted resolver (there is no DNS server here): answers in order, counting lookups."""

    def __init__(self, *answers: list[str] | Exception) -> None:
        self.answers = list(answers)
        self.lookups = 0

    async def __call__(self, host: str, port: int, family: int) -> list[tuple[Any, ...]]:
        answer = self.answers[min(self.lookups, len(self.answers) - 1)]
        self.lookups += 1
        if isinstance(answer, Exception):
            raise answer
        out: list[tuple[Any, ...]] = []
        for ip in answer:
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            out.append((fam, socket.SOCK_STREAM, 6, "", (ip, port) if fam == socket.AF_INET else (ip, port, 0, 0)))
        return out


async def test_host_name_pinned_to_the_checked_address(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    # First answer passes; any later one (a rebinding attempt) would point at a private address.
    dns = ScriptedDNS(["127.0.0.1"], ["10.0.0.1"])
    loader = make_loader(lookup=dns)
    image = await loader.load(f"http://images.test:{origin.port}/img/a.png")
    assert image.width == 64 and origin.hits["/img/a.png"] == 1
    assert dns.lookups == 1  # checked and connected from the same single answer


@pytest.mark.parametrize("answer", [["10.0.0.1"], ["127.0.0.1", "10.0.0.1"], ["169.254.169.254"],
                                    ["::ffff:10.0.0.1"], ["fd00:ec2::254"], []])
async def test_host_name_resolving_to_a_refused_address(
    origin: ImageOrigin, make_loader: LoaderFactory, answer: list[str]
) -> None:
    origin.add("a.png", make_image("PNG"))
    loader = make_loader(lookup=ScriptedDNS(answer))
    with pytest.raises(ForbiddenURLError, match=r"images\.test"):
        await loader.load(f"http://images.test:{origin.port}/img/a.png", param="p")
    assert origin.hits["/img/a.png"] == 0


async def test_dns_failure_is_an_origin_error(make_loader: LoaderFactory) -> None:
    loader = make_loader(lookup=ScriptedDNS(socket.gaierror(socket.EAI_NONAME, "Name or service not known")))
    with pytest.raises(OriginError, match="could not resolve") as info:
        await loader.load("http://no-such-host.test/a.png")
    assert info.value.status == 502


async def test_the_resolver_refuses_a_name_getaddrinfo_cannot_encode() -> None:
    """The real getaddrinfo raises UnicodeError (its IDNA step) on an empty or 64-character label,
    before any lookup: a 400 naming the host, not an exception aiohttp turns into a 500."""
    resolver = PolicyResolver(UrlPolicy(MediaSettings()), timeout_s=5)
    for host in ("a..example", "a" * 64 + ".example"):
        with pytest.raises(ForbiddenURLError, match="invalid host") as info:
            await resolver.resolve(host, 80)
        assert info.value.status == 400


async def test_real_resolver_with_an_allowed_name(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    origin.add("a.png", make_image("PNG"))
    try:
        socket.getaddrinfo("localhost", origin.port)
    except OSError:
        pytest.skip("this machine cannot resolve localhost")
    loader = make_loader(media={"allowed_private": ("localhost",)})
    assert (await loader.load(f"http://localhost:{origin.port}/img/a.png")).width == 64
    with pytest.raises(ForbiddenURLError):  # the name is opened, not the address
        await loader.load(origin.url("/img/a.png"))


# -- file: -------------------------------------------------------------------------------------


async def test_file_urls(tmp_path: Path, make_loader: LoaderFactory) -> None:
    root = tmp_path / "media"
    root.mkdir()
    (root / "a.png").write_bytes(make_image("PNG", 10, 10))
    (tmp_path / "outside.png").write_bytes(make_image("PNG", 10, 10))
    os.symlink(tmp_path / "outside.png", root / "link.png")
    refused = make_loader()
    with pytest.raises(ForbiddenURLError, match="file: URLs are refused"):
        await refused.load(f"file://{root}/a.png")
    registry = CollectorRegistry()
    loader: MediaLoader = make_loader(
        media={"allowed_local_media_path": str(root), "max_image_bytes": 100_000}, registry=registry
    )
    assert (await loader.load(f"file://{root}/a.png")).width == 10
    assert registry.get_sample_value("mmgate_origin_bytes_total") == (root / "a.png").stat().st_size
    for bad in (f"file://{root}/../outside.png", f"file://{root}/link.png"):
        with pytest.raises(ForbiddenURLError, match="outside"):
            await loader.load(bad)
    with pytest.raises(OriginError, match="no such file"):
        await loader.load(f"file://{root}/missing.png")
    with pytest.raises(OriginError, match="not a regular file"):
        await loader.load(f"file://{root}/")
    (root / "big.png").write_bytes(b"\x00" * 100_001)
    with pytest.raises(ImageTooLargeError):
        await loader.load(f"file://{root}/big.png")


async def test_load_after_close_fails_cleanly(origin: ImageOrigin, make_loader: LoaderFactory) -> None:
    url = origin.add("a.png", make_image("PNG"))
    loader = make_loader()
    await loader.close()
    with pytest.raises(OriginError, match="shutting down"):
        await loader.load(url)
    with pytest.raises(OriginError, match="shutting down"):
        await loader.load(data_url(make_image("PNG")))
    assert origin.hits["/img/a.png"] == 0
