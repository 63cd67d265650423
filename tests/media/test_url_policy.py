"""URL policy (SSRF): every address spelling, decided with no socket opened."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

from mmgate.config import MediaSettings
from mmgate.errors import ForbiddenURLError
from mmgate.media.addresses import parse_legacy_ipv4
from mmgate.media.url_policy import UrlPolicy, redact_url


@pytest.fixture(autouse=True)
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tripwire, not a fake: policy decisions must not open sockets or resolve names."""

    def tripped(*_a: object, **_k: object) -> None:
        raise AssertionError("the policy touched the network")

    monkeypatch.setattr(socket, "socket", tripped)
    monkeypatch.setattr(socket, "getaddrinfo", tripped)
    monkeypatch.setattr(socket, "create_connection", tripped)


def policy(**media: object) -> UrlPolicy:
    return UrlPolicy(MediaSettings(**media))  # type: ignore[arg-type]


REFUSED = [
    "http://10.0.0.1/a.png",
    "http://10.255.255.255/",
    "http://172.16.0.1/",
    "http://172.31.255.254/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.1.1/",
    "http://127.0.0.1/",
    "http://127.0.0.1:8080/",
    "http://127.255.255.254/",
    "http://0.0.0.0/",
    "http://100.64.0.1/",  # CGNAT
    "http://100.100.100.200/",  # Alibaba metadata
    "http://192.0.0.1/",
    "http://192.0.2.1/",
    "http://198.18.0.1/",
    "http://224.0.0.1/",
    "http://239.255.255.250/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://[::1]/",
    "http://[::]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[fe80::1]/",
    "http://[fe80::1%25eth0]/",
    "http://[fc00::1]/",
    "http://[fd00:ec2::254]/",
    "http://[ff02::1]/",
    "http://[2001:db8::1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::127.0.0.1]/",  # IPv4-compatible
    "http://[64:ff9b::7f00:1]/",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://[64:ff9b:1::1]/",  # local-use NAT64
    "http://[2002:7f00:1::1]/",  # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::1]/",  # 6to4 of 169.254.169.254
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",  # Teredo
    "http://2130706433/",  # decimal 127.0.0.1
    "http://0x7f000001/",  # hex
    "http://0X7F000001/",
    "http://0177.0.0.1/",  # octal
    "http://0177.0000.0000.0001/",
    "http://017700000001/",
    "http://0x7f.0.0.1/",
    "http://0x7f.1/",
    "http://127.1/",  # short forms
    "http://127.0.1/",
    "http://0/",
    "http://167772161/",  # 10.0.0.1
    "http://2852039166/",  # 169.254.169.254
    "http://0xa9fea9fe/",
    "http://127.0.0.1./",  # trailing dot
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",  # full-width digits (IDNA maps them)
    "http://localhost/",
    "http://LOCALHOST./",
    "http://img.localhost/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.GOOGLE.INTERNAL./",
    "http://metadata/",
    "http://instance-data/",
    "http://256.1.1.1/",  # numeric but out of range
    "http://1.2.3.256/",
    "http://" + "a" * 64 + ".example/",  # not DNS names: getaddrinfo's IDNA step raises on them
    "http://a..example/",
    "http://.a.example/",
    "http://" + ".".join(["a" * 63] * 4) + "/",  # 255 characters
]


@pytest.mark.parametrize("url", REFUSED)
def test_refused_by_default(url: str) -> None:
    with pytest.raises(ForbiddenURLError) as info:
        policy().check_url(url)
    assert info.value.status == 400


ACCEPTED = [
    "http://8.8.8.8/a.png",
    "https://93.184.216.34/x.jpg?sig=1",
    "http://1.1.1.1:8080/",
    "http://[2606:4700:4700::1111]/",
    "http://[::ffff:8.8.8.8]/",  # mapped public
    "http://[64:ff9b::808:808]/",  # NAT64 of 8.8.8.8
    "http://[2002:808:808::1]/",  # 6to4 of 8.8.8.8
    "http://example.com/img.png",
    "https://Images.Example.ORG:8443/a.jpg",
    "http://0xdeadbeef.com/",  # a name, not a number
    "http://1e100.net/",
    "http://" + "a" * 63 + ".example./x.png",  # the longest label, a trailing dot
    "http://" + ".".join(["a" * 63] * 3 + ["a" * 61]) + "/",  # 253 characters
]


@pytest.mark.parametrize("url", ACCEPTED)
def test_accepted_by_default(url: str) -> None:
    checked = policy().check_url(url)
    assert checked.host


@pytest.mark.parametrize("host", ["a" * 64 + ".example", "a..example", ".a.example", "a.example.."])
def test_a_host_that_is_no_dns_name_is_refused_by_name(host: str) -> None:
    with pytest.raises(ForbiddenURLError, match="not a DNS name") as info:
        policy().check_url(f"http://{host}/x.png", what="video_url URL")
    assert info.value.status == 400


def test_non_canonical_public_address_is_refused_with_the_canonical_form() -> None:
    with pytest.raises(ForbiddenURLError, match=r"write it as 8\.8\.8\.8"):
        policy().check_url("http://134744072/")


@pytest.mark.parametrize("url", ["ftp://8.8.8.8/a.png", "gopher://8.8.8.8/", "javascript:alert(1)",
                                 "file:///etc/passwd", "data:image/png;base64,AAAA", "//8.8.8.8/a", "http:///a"])
def test_schemes_other_than_http_are_refused(url: str) -> None:
    with pytest.raises(ForbiddenURLError):
        policy().check_url(url)


def test_allowed_private_opens_exactly_what_it_names() -> None:
    p = policy(allowed_private=("127.0.0.1", "10.0.0.0/8", "images.internal"))
    for url in ("http://127.0.0.1:9000/a", "http://[::ffff:127.0.0.1]/", "http://10.1.2.3/", "http://10.255.0.1/"):
        p.check_url(url)
    for url in ("http://127.0.0.2/", "http://[::1]/", "http://192.168.0.1/", "http://localhost/",
                "http://2130706433/"):  # a listed address in a non-canonical spelling stays refused
        with pytest.raises(ForbiddenURLError):
            p.check_url(url)
    p.check_url("http://images.internal/a.png")
    p.check_resolved("images.internal", [ipaddress.ip_address("192.168.7.7")])  # the name is opened
    with pytest.raises(ForbiddenURLError, match=r"other\.internal: it resolves to a private address") as err:
        p.check_resolved("other.internal", [ipaddress.ip_address("192.168.7.7")])
    assert "192.168" not in err.value.message  # the gateway's network is not described to clients


def test_every_resolved_address_must_pass() -> None:
    p = policy()
    p.check_resolved("img.example", [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("2606:4700::1")])
    refused = [(["8.8.8.8", "10.0.0.1"], "private"), (["::ffff:127.0.0.1"], "loopback"),
               (["64:ff9b::a00:1"], "private")]  # NAT64: the IPv4 address it embeds is judged
    for addresses, kind in refused:
        with pytest.raises(ForbiddenURLError, match=f"resolves to a {kind} address") as err:
            p.check_resolved("img.example", [ipaddress.ip_address(a) for a in addresses])
        assert not any(part in err.value.message for part in ("10.0", "127.0", "64:ff9b"))
    with pytest.raises(ForbiddenURLError):
        p.check_resolved("img.example", [])


@pytest.mark.parametrize("opened", ["169.254.0.0/16", "0.0.0.0/0", "::/0", "169.254.169.254", "fd00::/8"])
def test_metadata_stays_refused_whatever_is_allowed(opened: str) -> None:
    p = policy(allowed_private=(opened, "metadata.google.internal"))
    for url in ("http://169.254.169.254/", "http://[fd00:ec2::254]/", "http://[::ffff:169.254.169.254]/",
                "http://metadata.google.internal/"):
        with pytest.raises(ForbiddenURLError, match="metadata"):
            p.check_url(url)
    with pytest.raises(ForbiddenURLError, match="metadata"):
        p.check_resolved("metadata.google.internal", [ipaddress.ip_address("169.254.169.254")])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
     ("0177.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("127.0.1", "127.0.0.1"), ("0", "0.0.0.0"),
     ("0x", "0.0.0.0"), ("10.0x10.0200.1", "10.16.128.1"), ("example.com", None), ("1e100", None),
     ("0xg", None), ("08", None), ("1.2.3.4.5", None)],
)
def test_legacy_ipv4_parsing(text: str, expected: str | None) -> None:
    got = parse_legacy_ipv4(text)
    assert (str(got) if got is not None else None) == expected


def test_legacy_ipv4_out_of_range() -> None:
    for text in ("4294967296", "256.0.0.1", "1.16777216", "0x100000000"):
        with pytest.raises(ValueError):
            parse_legacy_ipv4(text)


def test_redact_url_hides_query_and_userinfo() -> None:
    shown = redact_url("https://user:secret@Img.Example.com:8443/a/b.png?token=s3cr3t#frag")
    assert "secret" not in shown and "s3cr3t" not in shown and "frag" not in shown
    assert shown == "https://img.example.com:8443/a/b.png?…"


# -- file: -------------------------------------------------------------------------------------


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.png").write_bytes(b"png")
    (tmp_path / "secret.png").write_bytes(b"secret")
    (tmp_path / "media-evil").mkdir()
    (tmp_path / "media-evil" / "x.png").write_bytes(b"x")
    os.symlink(tmp_path / "secret.png", root / "escape.png")
    os.symlink(tmp_path, root / "up")
    os.symlink(root / "sub" / "a.png", root / "inner.png")
    return root


def test_file_urls_refused_without_a_root(media_dir: Path) -> None:
    with pytest.raises(ForbiddenURLError, match="allowed-local-media-path"):
        policy().check_file_url(f"file://{media_dir}/sub/a.png")


def test_file_url_inside_root(media_dir: Path) -> None:
    p = policy(allowed_local_media_path=str(media_dir))
    assert p.check_file_url(f"file://{media_dir}/sub/a.png") == str(media_dir / "sub" / "a.png")
    assert p.check_file_url(f"file://localhost{media_dir}/sub/a.png") == str(media_dir / "sub" / "a.png")
    # a symlink that stays inside is fine, and resolves to its target
    assert p.check_file_url(f"file://{media_dir}/inner.png") == str(media_dir / "sub" / "a.png")


@pytest.mark.parametrize(
    "suffix",
    ["/../secret.png", "/sub/../../secret.png", "/%2e%2e/secret.png", "/escape.png", "/up/secret.png",
     "/../media-evil/x.png"],
)
def test_file_url_escapes_are_refused(media_dir: Path, suffix: str) -> None:
    p = policy(allowed_local_media_path=str(media_dir))
    with pytest.raises(ForbiddenURLError, match="outside the allowed"):
        p.check_file_url(f"file://{media_dir}{suffix}")


def test_file_url_with_a_remote_host_is_refused(media_dir: Path) -> None:
    p = policy(allowed_local_media_path=str(media_dir))
    with pytest.raises(ForbiddenURLError, match="remote host"):
        p.check_file_url(f"file://fileserver{media_dir}/sub/a.png")
