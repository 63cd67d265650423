"""What audio reuse saves and what the gateway's audio check costs, on this machine.

1. The gateway's check of a ``data:`` audio (``mmgate.media.audio.check_data_audio``: base64
   decode, SHA-256, PyAV header probe) against the base64 decode alone, alternating, per size.
2. One real vLLM replica of the tiny Qwen2-Audio (``tools/tiny_qwen2audio.py``), called directly:
   a turn that sends a fresh audio with a uuid (processed: resampled, Whisper features, encoder)
   against the turn that references it by uuid (a processor-cache hit), alternating, and the
   replica's ``vllm:mm_cache_*`` counters.

    .venv/bin/python benchmarks/studies/audio_reuse_cost.py --rounds 10

The method: docs/benchmarks/audio-reuse-cost.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pybase64
from tests.support.audio import data_url, wav
from tests.support.vllm import VllmReplica, VllmSetup

from benchmarks._run import write_results
from mmgate.media.audio import check_data_audio

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-qwen2audio"


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.2f} ms"


def probe_cost(rounds: int) -> list[dict[str, Any]]:
    rows = []
    for seconds in (5.0, 30.0):
        url = data_url(wav(seconds))
        payload = url[url.index(",") + 1:]
        check, decode = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            check_data_audio(url, max_bytes=64 << 20)
            check.append(time.perf_counter() - t)
            t = time.perf_counter()
            pybase64.b64decode(payload, validate=True)
            decode.append(time.perf_counter() - t)
        print(f"check of a {seconds:g} s 16 kHz WAV ({len(url) / 1e6:.2f} MB of data URL): {ms(check)}; "
              f"base64 decode alone {ms(decode)}")
        rows.append({"seconds": seconds, "data_url_bytes": len(url), "check_s": statistics.median(check),
                     "base64_decode_s": statistics.median(decode)})
    return rows


def post(url: str, part: dict[str, object]) -> tuple[float, int]:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": [
        part, {"type": "text", "text": "What is this sound?"}]}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())
    return time.perf_counter() - t, answer["usage"]["prompt_tokens"]


def engine_cost(rounds: int, seconds: float) -> dict[str, Any]:
    located = VllmSetup.locate()
    setup = VllmSetup(located.python, ROOT / "build" / MODEL, located.start_timeout_s)
    subprocess.run([str(setup.python), str(ROOT / "tools" / "tiny_qwen2audio.py"), "--out", str(setup.model_dir)],
                   check=True, timeout=120)
    with tempfile.TemporaryDirectory() as tmp:
        replica = VllmReplica(setup, Path(tmp) / "vllm.log", extra_args=("--limit-mm-per-prompt", '{"audio": 1}'))
        replica.model = MODEL
        try:
            replica.start()
            post(replica.url, {"type": "input_audio", "input_audio": {
                "data": base64.b64encode(wav(seconds, freq=100.0)).decode(), "format": "wav"}, "uuid": "warm"})
            full, ref, tokens = [], [], 0
            before = replica.cache_counters()
            for i in range(rounds):
                data = base64.b64encode(wav(seconds, freq=200.0 + i)).decode()
                took, tokens = post(replica.url, {"type": "input_audio", "input_audio": {"data": data, "format": "wav"},
                                                  "uuid": f"a{i}"})
                full.append(took)
                ref.append(post(replica.url, {"type": "input_audio", "input_audio": None, "uuid": f"a{i}"})[0])
            queries, hits = (a - b for a, b in zip(replica.cache_counters(), before, strict=True))
        finally:
            replica.stop()
    print(f"vLLM, a {seconds:g} s audio ({tokens} prompt tokens), max_tokens 1, median of {rounds}: "
          f"sent {ms(full)}, referenced by uuid {ms(ref)}; mm cache queries +{queries:g}, hits +{hits:g}")
    return {"seconds": seconds, "prompt_tokens": tokens, "sent_s": statistics.median(full),
            "referenced_s": statistics.median(ref), "cache_queries": queries, "cache_hits": hits}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seconds", type=float, default=10.0, help="audio length for the vLLM turns")
    p.add_argument("--out", default="results/audio_reuse_cost.json")
    args = p.parse_args()
    load = [os.getloadavg()[0]]
    print(f"load {load[0]:.2f}")
    checks = probe_cost(max(args.rounds, 20))
    engine = engine_cost(args.rounds, args.seconds)
    load.append(os.getloadavg()[0])
    print(f"load {load[1]:.2f}")
    write_results(args.out, {"load": load, "rounds": args.rounds, "check": checks, "vllm": engine})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
