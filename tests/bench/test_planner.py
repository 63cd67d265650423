"""The --uuid-and-strip planner (pure) and the request body it produces."""

from __future__ import annotations

import orjson

from mmgate.bench.dataset import ImageEntry, Turn
from mmgate.bench.payload import BodyOptions, render_messages, request_body
from mmgate.bench.planner import PlannedImage, StripPlanner, TurnImage, count_plan


def slot(name: str, authored: str | None = None) -> TurnImage:
    return TurnImage(f"data:image/png;base64,{name}", authored, f"hash-{name}")


def test_repeats_become_references_only_after_a_committed_request() -> None:
    planner = StripPlanner(enabled=True)
    first = planner.plan([slot("a"), slot("b")])
    assert first == [PlannedImage(slot("a").url, "hash-a"), PlannedImage(slot("b").url, "hash-b")]
    # Not committed (request failed): the next request still sends data.
    assert planner.plan([slot("a")])[0].url is not None
    planner.commit(first)
    second = planner.plan([slot("a"), slot("b"), slot("c")])
    assert second[0] == PlannedImage(None, "hash-a", stripped=True)
    assert second[1] == PlannedImage(None, "hash-b", stripped=True)
    assert second[2] == PlannedImage(slot("c").url, "hash-c")
    counts = count_plan(second)
    assert (counts.logical_images, counts.images_with_data, counts.cache_only_refs, counts.stripped_refs) == (3, 1, 2, 2)
    assert counts.image_bytes_sent == len(slot("c").url or "")


def test_authored_uuid_wins_and_authored_references_pass_through() -> None:
    planner = StripPlanner(enabled=True)
    plan = planner.plan([slot("a", authored="mine"), TurnImage(None, "ref", None)])
    assert plan == [PlannedImage(slot("a").url, "mine"), PlannedImage(None, "ref")]
    planner.commit(plan)
    again = planner.plan([slot("a", authored="mine")])
    assert again == [PlannedImage(None, "mine", stripped=True)]
    assert count_plan(plan).stripped_refs == 0  # the dataset's own reference is not "stripped"


def test_duplicate_inside_one_request_keeps_its_data() -> None:
    planner = StripPlanner(enabled=True)
    plan = planner.plan([slot("a"), slot("a")])
    assert all(p.url is not None for p in plan)


def test_forget_after_cache_miss_resends() -> None:
    planner = StripPlanner(enabled=True)
    planner.commit(planner.plan([slot("a")]))
    assert planner.plan([slot("a")])[0].is_cache_only
    planner.forget()
    assert planner.plan([slot("a")])[0].url is not None


def test_disabled_planner_passes_dataset_through() -> None:
    planner = StripPlanner(enabled=False)
    plan = planner.plan([slot("a"), slot("b", authored="u"), TurnImage(None, "ref", None)])
    planner.commit(plan)
    assert planner.plan([slot("a"), slot("b", authored="u"), TurnImage(None, "ref", None)]) == [
        PlannedImage(slot("a").url, None), PlannedImage(slot("b").url, "u"), PlannedImage(None, "ref"),
    ]


def test_rendered_history_threads_replies_and_places_plan_in_order() -> None:
    t1 = Turn(("one",), (ImageEntry("x", None),))
    t2 = Turn(("two",), ())
    t3 = Turn(("three",), (ImageEntry("y", None), ImageEntry(None, "k")))
    plan = [PlannedImage(None, "ux", True), PlannedImage("data:y", "uy"), PlannedImage(None, "k")]
    messages = render_messages("sys", [(t1, "reply one"), (t2, None)], t3, plan)
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "one"},
                                     {"type": "image_url", "image_url": None, "uuid": "ux"}]},
        {"role": "assistant", "content": "reply one"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "three"},
                                     {"type": "image_url", "image_url": {"url": "data:y"}, "uuid": "uy"},
                                     {"type": "image_url", "image_url": None, "uuid": "k"}]},
    ]
    body = request_body(BodyOptions("m", stream=True, output_length=5, extra_body={"temperature": 0}),
                        messages, Turn(("x",), (), output_length=9, extra={"top_p": 0.5}))
    assert orjson.loads(orjson.dumps(body)) | {"messages": None} == {
        "model": "m", "messages": None, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": 9, "temperature": 0, "top_p": 0.5,
    }
