"""Token counting, deterministic text and the timing model (pure)."""

from __future__ import annotations

from mmgate.sim.config import SimSettings
from mmgate.sim.generation import (
    count_prompt_text_tokens,
    count_text_tokens,
    decode_seconds_per_token,
    natural_length,
    plan_generation,
    prefill_seconds,
    prompt_seed,
)


def test_text_tokens_are_about_four_characters() -> None:
    assert count_text_tokens("") == 0
    assert count_text_tokens("abcd") == 1
    assert count_text_tokens("abcde") == 2
    assert count_prompt_text_tokens(["abcd", "abcd"], num_messages=2) == 2 + 3 * 2 + 3


def test_seed_depends_on_text_and_images() -> None:
    base = prompt_seed(["hello"], ["k1"])
    assert base == prompt_seed(["hello"], ["k1"])
    assert base != prompt_seed(["hello"], ["k2"])
    assert base != prompt_seed(["hello!"], ["k1"])
    assert prompt_seed(["ab", "c"], []) != prompt_seed(["a", "bc"], [])


def test_plan_honours_max_min_and_ignore_eos() -> None:
    seed = prompt_seed(["x"], [])
    eos = natural_length(seed)
    short = plan_generation(seed, max_tokens=eos - 1, min_tokens=0, ignore_eos=False)
    assert len(short.tokens) == eos - 1 and short.finish_reason == "length"
    natural = plan_generation(seed, max_tokens=eos + 50, min_tokens=0, ignore_eos=False)
    assert len(natural.tokens) == eos and natural.finish_reason == "stop"
    forced = plan_generation(seed, max_tokens=eos + 50, min_tokens=0, ignore_eos=True)
    assert len(forced.tokens) == eos + 50 and forced.finish_reason == "length"
    longer = plan_generation(seed, max_tokens=eos + 50, min_tokens=eos + 10, ignore_eos=False)
    assert len(longer.tokens) == eos + 10 and longer.finish_reason == "stop"
    assert natural.tokens == forced.tokens[:eos]  # same prompt, same words


def test_timing_model_scales_with_speedup() -> None:
    slow = SimSettings(prefill_us_per_text_token=100, prefill_us_per_image_token=200, decode_ms_per_token=20)
    fast = slow.model_copy(update={"speedup": 10.0})
    assert prefill_seconds(1000, 500, slow) == 0.1 + 0.1
    assert abs(prefill_seconds(1000, 500, fast) - 0.02) < 1e-12
    assert decode_seconds_per_token(slow) == 0.02
    sent = slow.model_copy(update={"sent_us_per_image_token": 400.0, "miss_us_per_image_token": 1000.0})
    assert abs(prefill_seconds(1000, 500, sent, sent_image_tokens=250) - 0.3) < 1e-12
    assert abs(prefill_seconds(1000, 500, sent, sent_image_tokens=250, missed_image_tokens=100) - 0.4) < 1e-12
    assert abs(decode_seconds_per_token(fast) - 0.002) < 1e-12


def test_byte_level_counts_follow_qwen2_vl_template() -> None:
    """The tiny Qwen2-VL's byte tokenizer through its chat template (checked against real vLLM:
    "Describe the image." alone is 76 prompt tokens, "Hello there" as string content 68)."""
    from mmgate.sim.generation import count_prompt_bytes_tokens

    assert count_prompt_bytes_tokens(["user"], [len("Describe the image.")]) == 76
    assert count_prompt_bytes_tokens(["user"], [len("Hello there")]) == 68
    assert count_prompt_bytes_tokens(["system", "user", "assistant", "user"], [9, 2, 6, 5]) == 72


def test_profile_fills_only_what_is_not_given() -> None:
    profiled = SimSettings(profile="tiny-qwen2vl-cpu", decode_ms_per_token=1.0)
    assert (profiled.model, profiled.max_model_len, profiled.text_tokens) == ("tiny-qwen2vl", 4096, "bytes")
    assert profiled.decode_ms_per_token == 1.0
    assert SimSettings().text_tokens == "estimate" and SimSettings().request_overhead_ms == 0
