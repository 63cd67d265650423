"""Pure reuse logic, no event loop: the strip/render plan, the sent-uuid tracker, uuid namespacing
and API-key tenants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmgate.errors import AuthenticationError, ConfigError
from mmgate.reuse import ImageSlot
from mmgate.reuse.namespace import CONTENT_PREFIX, KeySpace
from mmgate.reuse.plan import SlotPlan, render
from mmgate.reuse.sent import SentTracker, estimated_processed_bytes
from mmgate.reuse.tenants import TenantKeys
from mmgate.store.types import LoadedImage


def image(tag: bytes = b"x") -> LoadedImage:
    return LoadedImage(data=tag * 10, mime="image/png", width=4, height=4, digest=tag.hex() * 8)


def plan(index: int, key: str, img: LoadedImage | None, part: dict[str, Any] | None = None) -> SlotPlan:
    part = part if part is not None else {"type": "image_url", "image_url": {"url": "http://o/x.png"}}
    slot = ImageSlot(index=index, param=f"messages[0].content[{index}]", part=part,
                     url=None if img is None else "http://o/x.png", uuid=None)
    return SlotPlan(slot=slot, key=key, image=img, from_client=img is not None)


def test_render_strips_only_keys_the_backend_holds() -> None:
    a, b, ref = plan(0, "ka", image(b"a")), plan(1, "kb", image(b"b")), plan(2, "kc", None)
    counts = render([a, b, ref], with_uuid=True, already_sent={"ka", "kc"})
    assert a.slot.part == {"type": "image_url", "image_url": None, "uuid": "ka"}
    assert b.slot.part["image_url"]["url"].startswith("data:image/png;base64,")
    assert b.slot.part["uuid"] == "kb"
    assert ref.slot.part == {"type": "image_url", "image_url": None, "uuid": "kc"}
    assert (counts.sent, counts.stripped, counts.references) == (1, 1, 1)
    assert counts.bytes_not_sent == 10
    assert (a.sent_data, b.sent_data, ref.sent_data) == (False, True, False)


def test_force_data_and_openai_shape() -> None:
    a = plan(0, "ka", image(), {"type": "image_url", "image_url": {"url": "u", "detail": "low"}, "uuid": "c"})
    counts = render([a], with_uuid=True, already_sent={"ka"}, force_data=True)
    assert counts.sent == 1 and a.slot.part["image_url"]["detail"] == "low"
    render([a], with_uuid=False, already_sent=set())
    assert "uuid" not in a.slot.part


def test_sent_tracker_is_bounded_by_the_backend_budget() -> None:
    per_image = estimated_processed_bytes(100, 100, 10**9)
    tracker = SentTracker(budget_bytes=3 * per_image)
    for i in range(5):
        tracker.mark_sent("b0", f"k{i}", 100, 100)
    assert tracker.num_tracked("b0") == 3
    assert not tracker.was_sent("b0", "k0") and tracker.was_sent("b0", "k4")
    assert not tracker.was_sent("b1", "k4")  # per backend
    tracker.reset("b0")
    assert not tracker.was_sent("b0", "k4")


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
    import hashlib

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


def test_tenant_keys(tmp_path: Path) -> None:
    keys = TenantKeys.from_env("k1=alpha, k2=beta")
    assert keys.tenant_for("Bearer k1") == "alpha" and keys.tenant_for("bearer  k2 ") == "beta"
    for header in (None, "", "Bearer", "Basic k1", "Bearer nope"):
        with pytest.raises(AuthenticationError):
            keys.tenant_for(header)
    bad = tmp_path / "bad.txt"
    bad.write_text("only-one-field\n")
    with pytest.raises(ConfigError) as info:
        TenantKeys.from_file(str(bad))
    assert "bad.txt:1" in info.value.message
    good = tmp_path / "keys.json"
    good.write_text('{"k9": "gamma"}')
    assert TenantKeys.from_file(str(good)).tenant_for("Bearer k9") == "gamma"
