"""N real vLLM replicas (CPU build, tiny Qwen2-VL, dummy weights) on loopback, with ``mmgate serve``
in front, until Ctrl-C. What ``make run-vllm`` runs (with mmgate's venv python)::

    .venv/bin/python tools/run_vllm.py --replicas 2 --port 8000 -- --reuse auto

Everything after ``--`` goes to ``mmgate serve``. The replicas pick free ports (printed), log to
``build/run-vllm/vllm-N.log`` and are stopped, process group and all, when the gateway exits.
The vLLM venv and model come from ``MMGATE_VLLM_VENV`` / ``MMGATE_VLLM_MODEL`` (``make`` sets them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.vllm import VllmSetup, VllmStartError, VllmUnavailable, start_replicas  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2, help="vLLM replicas to start (default %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="gateway address (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="gateway port (default %(default)s)")
    p.add_argument("--log-dir", type=Path, default=ROOT / "build" / "run-vllm")
    p.add_argument("serve_args", nargs="*", help="more `mmgate serve` flags, after --")
    args = p.parse_args(argv)
    try:
        setup = VllmSetup.locate()
    except VllmUnavailable as exc:
        print(f"run_vllm: {exc}", file=sys.stderr)
        return 1
    print(f"run_vllm: starting {args.replicas} vLLM replicas (60-90 s on 2 cores; logs in {args.log_dir})",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        replicas = start_replicas(setup, args.replicas, args.log_dir)
    except VllmStartError as exc:
        print(f"run_vllm: {exc}", file=sys.stderr)
        return 1
    try:
        for r in replicas:
            print(f"run_vllm: vLLM replica {r.url} (model {r.model!r}, log {r.log_path})", file=sys.stderr)
        print(f"run_vllm: replicas up in {time.monotonic() - started:.0f} s; gateway on "
              f"http://{args.host}:{args.port} (Ctrl-C stops everything)", file=sys.stderr, flush=True)
        backends = [f for r in replicas for f in ("--backend", f"vllm={r.url}")]
        cmd = [sys.executable, "-m", "mmgate", "serve", "--host", args.host, "--port", str(args.port),
               *backends, *args.serve_args]
        try:
            return subprocess.call(cmd)
        except KeyboardInterrupt:
            return 130
    finally:
        for r in replicas:
            r.stop()


if __name__ == "__main__":
    raise SystemExit(main())
