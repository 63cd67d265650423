"""The reuse plan, pure (no event loop): which slot goes as data, which as a cache-only reference."""

from __future__ import annotations

from typing import Any

from mmgate.reuse import ImageSlot
from mmgate.reuse.plan import SlotPlan, render
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
