"""Write a tiny Qwen2-VL model directory that real vLLM serves with ``--load-format dummy``.

No download and no weights: a ``config.json`` (Qwen2VLForConditionalGeneration, sizes from the
flags), a byte-level BPE tokenizer built here with ``tokenizers`` and carrying Qwen2-VL's special
tokens, the real Qwen2-VL image-processor config (14-pixel patches merged 2x2, so a 768x768 image
is 27x27 = 729 image tokens, as on the real model), a video-processor config, and Qwen2-VL's chat
template. vLLM then runs the real Qwen2-VL processor, processor cache and language model, with
random weights: the text it generates is noise, everything around it is vLLM's.

Run it with the vLLM venv's python (it needs ``tokenizers``)::

    .venv-vllm/bin/python tools/tiny_qwen2vl.py --out build/tiny-qwen2vl
    .venv-vllm/bin/python tools/tiny_qwen2vl.py --out build/tiny-lm --hidden-size 64 --layers 1
    .venv-vllm/bin/python tools/tiny_qwen2vl.py --out build/micro-qwen2vl --preset micro

``--preset micro`` is the model for the regime a GPU user lives in, where a turn's cost is vLLM's
API server handling images rather than the encoder and prefill: hidden 64, 1 layer, 2 heads,
vision depth 1, width 32, and an image processor that caps each image at 100,352 pixels
(128 image tokens). Explicit flags override a preset's values.

The directory is rewritten only when its stamp (the flags) changed, so re-running is free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Qwen2-VL's special tokens, in Qwen's order; ids follow the 256 byte tokens.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
NUM_BYTE_TOKENS = 256

# Qwen2-VL-2B-Instruct's chat template (images and videos counted, optional "Picture N:" ids).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


def special_id(token: str) -> int:
    return NUM_BYTE_TOKENS + SPECIAL_TOKENS.index(token)


# Named sizes; a preset's values are the defaults that explicit flags still override.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {},
    "micro": {"hidden_size": 64, "layers": 1, "heads": 2, "kv_heads": 1, "vision_depth": 1,
              "vision_width": 32, "vision_heads": 2, "max_pixels": 28 * 28 * 128},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="model directory to write")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="named sizes (default %(default)s; micro: the capped micro model, module docstring)")
    p.add_argument("--hidden-size", type=int, default=256, help="language model width (default %(default)s)")
    p.add_argument("--layers", type=int, default=2, help="language model layers (default %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default %(default)s)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default %(default)s)")
    p.add_argument("--intermediate-size", type=int, default=0, help="MLP width (default 4 x hidden size)")
    p.add_argument("--vision-depth", type=int, default=2, help="vision transformer blocks (default %(default)s)")
    p.add_argument("--vision-width", type=int, default=64, help="vision embed dim (default %(default)s)")
    p.add_argument("--vision-heads", type=int, default=2, help="vision attention heads (default %(default)s)")
    p.add_argument("--max-position-embeddings", type=int, default=32768)
    p.add_argument("--min-pixels", type=int, default=56 * 56, help="image processor min_pixels")
    p.add_argument("--max-pixels", type=int, default=28 * 28 * 1280, help="image processor max_pixels")
    p.add_argument("--force", action="store_true", help="rewrite even when the stamp matches")
    preset, _ = p.parse_known_args(argv)
    p.set_defaults(**PRESETS[preset.preset])
    args = p.parse_args(argv)
    head_dim, rest = divmod(args.hidden_size, args.heads)
    if rest or head_dim % 8:
        p.error("--hidden-size must be --heads x a multiple of 8 (the head dim is split in 3 rope sections)")
    if args.heads % args.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    if args.vision_width % args.vision_heads:
        p.error("--vision-width must be a multiple of --vision-heads")
    return args


def config(args: argparse.Namespace, vocab_size: int) -> dict[str, object]:
    """config.json in the layout transformers 5 writes (text_config + vision_config)."""
    half = args.hidden_size // args.heads // 2
    # Qwen2-VL's [16, 24, 24] of a 64-wide half head, scaled: temporal, height, width sections.
    mrope = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope}
    text = {
        "model_type": "qwen2_vl_text", "vocab_size": vocab_size, "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size or 4 * args.hidden_size,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": args.max_position_embeddings, "rms_norm_eps": 1e-6,
        "use_sliding_window": False, "max_window_layers": args.layers, "rope_parameters": rope,
        "rope_scaling": {"type": "mrope", "mrope_section": mrope}, "rope_theta": 1000000.0,
        "bos_token_id": special_id("<|endoftext|>"), "eos_token_id": special_id("<|im_end|>"),
        "tie_word_embeddings": False, "dtype": "bfloat16",
    }
    vision = {
        "model_type": "qwen2_vl", "depth": args.vision_depth, "embed_dim": args.vision_width,
        "hidden_size": args.hidden_size, "hidden_act": "quick_gelu", "mlp_ratio": 4,
        "num_heads": args.vision_heads, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        **{k: text[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "hidden_act",
                                "max_position_embeddings", "rms_norm_eps", "rope_scaling", "rope_theta",
                                "bos_token_id", "eos_token_id", "use_sliding_window", "max_window_layers")},
        "text_config": text, "vision_config": vision,
        "image_token_id": special_id("<|image_pad|>"), "video_token_id": special_id("<|video_pad|>"),
        "vision_start_token_id": special_id("<|vision_start|>"),
        "vision_end_token_id": special_id("<|vision_end|>"),
        "tie_word_embeddings": False, "dtype": "bfloat16",
    }


def write_tokenizer(out: Path, special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
                    chat_template: str = CHAT_TEMPLATE) -> int:
    """A byte-level BPE with no merges (one token per byte) plus ``special_tokens`` (ids after the
    bytes, in order; the first is padding, ``<|im_end|>`` the end); its size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    byte_symbols = pre_tokenizers.ByteLevel.alphabet()
    vocab = {sym: i for i, sym in enumerate(sorted(byte_symbols))}
    assert len(vocab) == NUM_BYTE_TOKENS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(NUM_BYTE_TOKENS + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": True}
        for i, t in enumerate(special_tokens)
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "model_max_length": 32768, "clean_up_tokenization_spaces": False,
        "chat_template": chat_template, "errors": "replace", "split_special_tokens": False,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(out / "special_tokens_map.json",
                {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                 "additional_special_tokens": list(special_tokens[1:])})
    return tok.get_vocab_size()


def processor_configs(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    common = {
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": IMAGE_MEAN, "image_std": IMAGE_STD, "resample": 3,
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "min_pixels": args.min_pixels, "max_pixels": args.max_pixels,
        "size": {"shortest_edge": args.min_pixels, "longest_edge": args.max_pixels},
    }
    return {
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor",
                                     "processor_class": "Qwen2VLProcessor", **common},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen2VLVideoProcessor",
                                           "processor_class": "Qwen2VLProcessor", **common},
        "chat_template.json": {"chat_template": CHAT_TEMPLATE},
        "generation_config.json": {"bos_token_id": special_id("<|endoftext|>"),
                                   "eos_token_id": [special_id("<|im_end|>"), special_id("<|endoftext|>")],
                                   "pad_token_id": special_id("<|endoftext|>")},
    }


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    stamp_value = {k: v for k, v in sorted(vars(args).items()) if k not in ("out", "force", "preset")}
    stamp_path = out / ".tiny_qwen2vl.json"
    stamp = json.dumps(stamp_value, sort_keys=True)
    if not args.force and stamp_path.exists() and stamp_path.read_text() == stamp:
        print(f"{out}: up to date", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(out)
    _write_json(out / "config.json", config(args, vocab_size))
    for name, value in processor_configs(args).items():
        _write_json(out / name, value)
    stamp_path.write_text(stamp)
    print(f"{out}: tiny Qwen2-VL (hidden {args.hidden_size}, {args.layers} layers, vision "
          f"{args.vision_depth}x{args.vision_width}, vocab {vocab_size})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
