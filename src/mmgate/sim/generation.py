"""Token counting, deterministic text and the timing model of the sim (pure logic).

Nothing here is a language model: prompt tokens are estimated (about four characters a token,
plus a few per message for the chat template), and the "generated" words are drawn from a fixed
vocabulary by a generator seeded with a hash of the prompt, so the same request always gets the
same answer.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mmgate.sim.config import SimSettings

# Chat-template tokens: "<|im_start|>role\n" … "<|im_end|>\n" per message, and the assistant prime.
MESSAGE_OVERHEAD_TOKENS = 3
GENERATION_PROMPT_TOKENS = 3
CHARS_PER_TOKEN = 4

VOCAB: tuple[str, ...] = (
    "the", "image", "shows", "a", "window", "with", "button", "text", "field", "menu", "on", "left",
    "right", "top", "bottom", "of", "screen", "and", "an", "icon", "next", "to", "label", "click",
    "open", "panel", "list", "item", "blue", "red", "green", "dark", "light", "small", "large",
    "table", "row", "column", "chart", "title", "header", "footer", "dialog", "tab", "page", "link",
    "scroll", "down", "up", "cursor", "near", "center", "corner", "view", "toolbar", "search", "box",
    "form", "input", "select", "option", "card", "grid", "logo",
)


def count_text_tokens(text: str) -> int:
    """Tokens of one text segment: ceil(characters / 4)."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def count_prompt_text_tokens(texts: Iterable[str], num_messages: int) -> int:
    """Text tokens of a chat prompt, chat-template overhead included."""
    body = sum(count_text_tokens(t) for t in texts)
    return body + MESSAGE_OVERHEAD_TOKENS * num_messages + GENERATION_PROMPT_TOKENS


# Qwen2-VL's chat template around the messages, as the tiny model's byte-level tokenizer counts it:
# each special token is one token, everything else one token per UTF-8 byte.
_DEFAULT_SYSTEM = "system\nYou are a helpful assistant."


def count_prompt_bytes_tokens(roles: Iterable[str], text_bytes: Iterable[int]) -> int:
    """Text tokens of a chat prompt under ``tools/tiny_qwen2vl.py``'s tokenizer (exact).

    ``<|im_start|>ROLE\n CONTENT <|im_end|>\n`` per message (a default system message first when
    the first message is not one), then ``<|im_start|>assistant\n``.
    """
    roles = list(roles)
    total = 0
    if not roles or roles[0] != "system":
        total += 1 + len(_DEFAULT_SYSTEM) + 1 + 1
    for role, size in zip(roles, text_bytes, strict=True):
        total += 1 + len(role.encode()) + 1 + size + 1 + 1
    return total + 1 + len("assistant\n")


def prompt_seed(texts: Iterable[str], image_keys: Iterable[str]) -> int:
    """A stable seed from everything the prompt contains (texts and image keys, in order)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(b"t")
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8", "surrogatepass"))
    for k in image_keys:
        h.update(b"i")
        h.update(k.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return int.from_bytes(h.digest()[:8], "little")


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """The tokens to emit (each a piece of text) and why generation ends."""

    tokens: tuple[str, ...]
    finish_reason: str  # "stop" (the modelled EOS, or a stop string) or "length" (max_tokens reached)
    stop_reason: str | None = None  # the stop string that ended it, as vLLM reports it

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def natural_length(seed: int) -> int:
    """Where the modelled EOS falls for this prompt: 8..255 tokens."""
    return 8 + (seed >> 17) % 248


def plan_generation(seed: int, *, max_tokens: int, min_tokens: int, ignore_eos: bool) -> GenerationPlan:
    """Honour max_tokens, min_tokens and ignore_eos like vLLM's sampler would."""
    eos_at = max(natural_length(seed), min_tokens)
    if ignore_eos or eos_at >= max_tokens:
        count, reason = max_tokens, "length"
    else:
        count, reason = eos_at, "stop"
    rng = random.Random(seed)
    words = rng.choices(VOCAB, k=count)
    tokens = tuple(w if i == 0 else " " + w for i, w in enumerate(words))
    return GenerationPlan(tokens=tokens, finish_reason=reason)


def stopped(plan: GenerationPlan, stop: Sequence[str], min_tokens: int = 0) -> GenerationPlan:
    """``plan`` ended by the first of ``stop`` its text completes, as vLLM's detokenizer ends it
    (``check_stop_strings``): the string that completes earliest (ties: the first listed), looked
    for past the first ``min_tokens`` tokens; the text cut before it, ``finish_reason`` "stop", the
    string as ``stop_reason``, and the tokens up to the one that completed it (their text past the
    cut not sent). ``plan`` itself when none is there."""
    text = plan.text
    offset = len("".join(plan.tokens[:min_tokens]))
    best: tuple[int, int, str] | None = None  # (end, start, string)
    for string in stop:
        start = text.find(string, max(0, offset - len(string) + 1)) if string else -1
        if start >= 0 and (best is None or start + len(string) < best[0]):
            best = (start + len(string), start, string)
    if best is None:
        return plan
    end, start, string = best
    kept: list[str] = []
    position = 0
    for token in plan.tokens:
        if position >= end:
            break
        kept.append(token[:max(0, start - position)])
        position += len(token)
    return GenerationPlan(tuple(kept), "stop", string)


def prefill_seconds(text_tokens: int, image_tokens: int, settings: SimSettings, *,
                    missed_image_tokens: int = 0, sent_image_tokens: int = 0) -> float:
    """Modelled time from admission to the first token: the fixed per-request part, prefill of
    every prompt token, the receiving of the images sent with their bytes, and the processor's
    extra work on the images that missed the cache."""
    micros = settings.request_overhead_ms * 1e3
    micros += text_tokens * settings.prefill_us_per_text_token
    micros += image_tokens * settings.prefill_us_per_image_token
    micros += missed_image_tokens * settings.miss_us_per_image_token
    micros += sent_image_tokens * settings.sent_us_per_image_token
    return micros / 1e6 / settings.speedup


def decode_seconds_per_token(settings: SimSettings) -> float:
    """Modelled time between two generated tokens."""
    return settings.decode_ms_per_token / 1e3 / settings.speedup
