"""The uuid a backend sees: client uuids pass through without tenants; tenant tags are keyed by the
server secret; client uuids and content uuids live in disjoint key spaces."""

from __future__ import annotations

import hashlib

import pytest

from mmgate.reuse import CONTENT_PREFIX, KeySpace
from mmgate.reuse.namespace import tag_of


def test_namespacing() -> None:
    keys = KeySpace(b"s" * 32)
    assert keys.backend_uuid(None, "u1") == "u1"
    assert keys.content_uuid(None, "ab") == CONTENT_PREFIX + "ab"
    a, b = keys.backend_uuid("tenant-a", "u1"), keys.backend_uuid("tenant-b", "u1")
    assert a != b and a.endswith("/u1") and a.startswith(keys.tenant_tag("tenant-a"))
    assert "tenant-a" not in a


def test_tenant_tags_are_keyed_by_the_server_secret() -> None:
    one, two = KeySpace(b"1" * 32), KeySpace(b"2" * 32)
    assert one.tenant_tag("alpha") == KeySpace(b"1" * 32).tenant_tag("alpha")
    assert one.tenant_tag("alpha") != two.tenant_tag("alpha")
    # The old unkeyed tag (blake2b of the name) is computable by anyone: it is not what we use.
    assert one.tenant_tag("alpha") != "t" + hashlib.blake2b(b"alpha", digest_size=8).hexdigest()
    assert KeySpace().tenant_tag("alpha") != KeySpace().tenant_tag("alpha")  # random per process


@pytest.mark.parametrize("tenant", [None, "alpha"])
@pytest.mark.parametrize(
    "uuid", ["~sha256:ab", "sha256:ab", "~~sha256:ab", "~", "~s", "~sha256:" + "0" * 64, "x/~sha256:ab"]
)
def test_client_uuids_never_produce_a_content_key(tenant: str | None, uuid: str) -> None:
    keys = KeySpace(b"k" * 32)
    digest = "0" * 64 if uuid.endswith("0" * 64) else "ab"
    assert keys.backend_uuid(tenant, uuid) != keys.content_uuid(tenant, digest)
    assert keys.backend_uuid(tenant, uuid) != keys.backend_uuid(tenant, uuid + "x")
    tag = "" if tenant is None else keys.tenant_tag(tenant) + "/"
    assert not keys.backend_uuid(tenant, uuid).startswith(tag + CONTENT_PREFIX)


def test_tag_of_reads_the_tag_and_nothing_else() -> None:
    keys = KeySpace(b"k" * 32)
    assert tag_of(keys.backend_uuid("a", "x")) == keys.tenant_tag("a")
    assert tag_of(keys.content_uuid("b", "0" * 64)) == keys.tenant_tag("b")
    assert tag_of("plain-client-uuid") == "" and tag_of("t" * 40) == ""
