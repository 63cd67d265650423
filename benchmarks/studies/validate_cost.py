"""What validating one image costs (the media loader's thread-pool job), per format and size.

For ~1 MiB images (a "photo-like" gradient with moderate noise, and pure noise): the Pillow
validation (header + full decode) with and without JPEG ``draft()`` (1/8-scale decode), the
SHA-256 digest, the cost of keying a ``data:`` URL the loader's repeat index has not seen
(base64-decoding then hashing the bytes: the key is the image's digest) and, for comparison,
hashing the base64 text instead (the key before). Median of N runs, one thread.

    .venv/bin/python benchmarks/studies/validate_cost.py --runs 15
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import statistics
import time
from collections.abc import Callable

from tests.support.images import image_of_about

from benchmarks._procs import ROOT
from benchmarks._run import write_results
from mmgate.media.checks import decoded_digest
from mmgate.media.dataurl import parse_data_url
from mmgate.media.validate import validate_image

FORMATS = ("JPEG", "PNG", "WEBP")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--bytes", type=int, default=1024 * 1024)
    parser.add_argument("--out", default="results/validate_cost.json")
    args = parser.parse_args()

    rows = []
    for noise in (0.15, 1.0):
        for fmt in FORMATS:
            data = image_of_about(fmt, args.bytes, noise=noise)
            url = f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode()

            def validate(draft: bool, data: bytes = data) -> object:
                return validate_image(data, allowed_formats=FORMATS, max_pixels=10**9, use_draft=draft)

            def text_hash(url: str = url) -> object:  # keying by the base64 text instead
                return hashlib.sha256(parse_data_url(url, max_bytes=1 << 30).payload.encode()).hexdigest()

            def data_key(url: str = url) -> object:  # the loader's key: decode, hash the bytes
                return decoded_digest(parse_data_url(url, max_bytes=1 << 30))

            info = validate(False)
            row = {
                "format": fmt,
                "noise": noise,
                "bytes": len(data),
                "pixels": f"{info.width}x{info.height}",  # type: ignore[attr-defined]
                "validate_ms": median_ms(lambda: validate(False), args.runs),
                "validate_draft_ms": median_ms(lambda: validate(True), args.runs) if fmt == "JPEG" else None,
                "sha256_ms": median_ms(functools.partial(sha256_hex, data), args.runs),
                "data_url_key_ms": median_ms(data_key, args.runs),
                "text_hash_ms": median_ms(text_hash, args.runs),
            }
            rows.append(row)

    head = f"{'format':6} {'noise':>5} {'bytes':>9} {'pixels':>11} {'validate':>9} {'+draft':>8} {'sha256':>7} {'data:key':>8} {'txt hash':>8}"
    print(head + "   (ms, median)")
    for r in rows:
        draft = f"{r['validate_draft_ms']:8.2f}" if r["validate_draft_ms"] is not None else f"{'-':>8}"
        print(f"{r['format']:6} {r['noise']:5.2f} {r['bytes']:9d} {r['pixels']:>11} {r['validate_ms']:9.2f} "
              f"{draft} {r['sha256_ms']:7.2f} {r['data_url_key_ms']:8.2f} {r['text_hash_ms']:8.2f}")
    out = ROOT / args.out
    write_results(out, {"runs": args.runs, "rows": rows})


if __name__ == "__main__":
    main()
