"""What every benchmark script shares around its measurement: ``--quick`` (a regression run's tiny
workload, so that ``tests/benchmarks/test_quick.py`` keeps each one running), SIGTERM raised as
``SystemExit`` (so a ``timeout`` or ``kill`` runs the script's ``finally`` and stops the servers it
started, vLLM among them: killed outright, they stay, busy-polling a core under the next run) and
the JSON file a run leaves."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any


def parse_args(
    parser: argparse.ArgumentParser, quick: Mapping[str, Any], argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """Parse the command line, with ``--quick`` added: it makes ``quick`` (argument name → value)
    the defaults, so a flag given beside it still wins (``--quick --out x.json``). From here on,
    SIGTERM ends the script through its ``finally`` blocks (``SystemExit(143)``)."""
    signal.signal(signal.SIGTERM, _exit_on_term)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny workload that runs in seconds, to check the run still works; its figures "
                             "mean nothing: " + " ".join(f"{k}={v}" for k, v in quick.items()))
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
        print("--quick: a tiny workload; its figures are no measurement", file=sys.stderr, flush=True)
    return parser.parse_args(argv)


def write_results(out: str | Path, result: Mapping[str, Any]) -> None:
    """Write ``result`` as indented JSON at ``out`` (its folder made; a ``Path`` or other value
    JSON cannot hold is written as its ``str``) and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}", flush=True)


def _exit_on_term(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
