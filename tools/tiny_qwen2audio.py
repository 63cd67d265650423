"""Write a tiny Qwen2-Audio model directory that real vLLM serves with ``--load-format dummy``.

No download and no weights, as ``tools/tiny_qwen2vl.py`` for Qwen2-VL: a ``config.json``
(Qwen2AudioForConditionalGeneration: a Whisper-style audio encoder, a projector and a Qwen2 language
model, sizes from the flags), the same byte-level tokenizer carrying Qwen2-Audio's special tokens,
the real Whisper feature-extractor config of Qwen2-Audio (16 kHz, 128 mel bins, 10 ms hop, 30 s
windows: one audio token per 40 ms, at most 750) and a chat template placing each audio's
``<|audio_bos|><|AUDIO|><|audio_eos|>``. vLLM then runs the real Qwen2-Audio processor, processor
cache, encoder and language model, with random weights: the text it generates is noise.

vLLM reads audio only with its ``audio`` extra installed (``make vllm`` does)::

    .venv-vllm/bin/python tools/tiny_qwen2audio.py --out build/tiny-qwen2audio

The directory is rewritten only when its stamp (the flags) changed, so re-running is free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_qwen2vl import NUM_BYTE_TOKENS, write_tokenizer  # a script beside this one

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")

# Qwen2-Audio-7B-Instruct's template, reading vLLM's ``{"type": "audio"}`` placeholders too.
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def special_id(token: str) -> int:
    return NUM_BYTE_TOKENS + SPECIAL_TOKENS.index(token)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="model directory to write")
    p.add_argument("--hidden-size", type=int, default=128, help="language model width (default %(default)s)")
    p.add_argument("--layers", type=int, default=2, help="language model layers (default %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default %(default)s)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default %(default)s)")
    p.add_argument("--audio-width", type=int, default=64, help="audio encoder d_model (default %(default)s)")
    p.add_argument("--audio-layers", type=int, default=1, help="audio encoder layers (default %(default)s)")
    p.add_argument("--audio-heads", type=int, default=2, help="audio encoder heads (default %(default)s)")
    p.add_argument("--max-position-embeddings", type=int, default=8192)
    p.add_argument("--force", action="store_true", help="rewrite even when the stamp matches")
    args = p.parse_args(argv)
    if args.hidden_size % args.heads or args.heads % args.kv_heads or args.audio_width % args.audio_heads:
        p.error("widths must divide by their heads, and --heads by --kv-heads")
    return args


def config(args: argparse.Namespace, vocab_size: int) -> dict[str, object]:
    text = {
        "model_type": "qwen2", "vocab_size": vocab_size, "hidden_size": args.hidden_size,
        "intermediate_size": 4 * args.hidden_size, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": args.max_position_embeddings, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "use_sliding_window": False, "tie_word_embeddings": False,
        "bos_token_id": special_id("<|endoftext|>"), "eos_token_id": special_id("<|im_end|>"), "dtype": "bfloat16",
    }
    audio = {
        "model_type": "qwen2_audio_encoder", "d_model": args.audio_width, "encoder_layers": args.audio_layers,
        "encoder_attention_heads": args.audio_heads, "encoder_ffn_dim": 4 * args.audio_width,
        "num_mel_bins": 128, "max_source_positions": 1500, "activation_function": "gelu",
        "scale_embedding": False,
    }
    return {
        "architectures": ["Qwen2AudioForConditionalGeneration"], "model_type": "qwen2_audio",
        "audio_config": audio, "text_config": text, "audio_token_index": special_id("<|AUDIO|>"),
        "vocab_size": vocab_size, "tie_word_embeddings": False, "dtype": "bfloat16",
    }


def processor_configs() -> dict[str, dict[str, object]]:
    return {
        "preprocessor_config.json": {
            "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "Qwen2AudioProcessor",
            "feature_size": 128, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30,
            "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
            "padding_value": 0.0, "return_attention_mask": True, "dither": 0.0,
        },
        "chat_template.json": {"chat_template": CHAT_TEMPLATE},
        "generation_config.json": {"bos_token_id": special_id("<|endoftext|>"),
                                   "eos_token_id": [special_id("<|im_end|>"), special_id("<|endoftext|>")],
                                   "pad_token_id": special_id("<|endoftext|>")},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    stamp = json.dumps({k: v for k, v in sorted(vars(args).items()) if k not in ("out", "force")}, sort_keys=True)
    stamp_path = out / ".tiny_qwen2audio.json"
    if not args.force and stamp_path.exists() and stamp_path.read_text() == stamp:
        print(f"{out}: up to date", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(out, SPECIAL_TOKENS, CHAT_TEMPLATE)
    values = {"config.json": config(args, vocab_size), **processor_configs()}
    for name, value in values.items():
        (out / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    stamp_path.write_text(stamp)
    print(f"{out}: tiny Qwen2-Audio (hidden {args.hidden_size}, {args.layers} layers, audio "
          f"{args.audio_layers}x{args.audio_width}, vocab {vocab_size})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
