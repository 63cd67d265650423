"""The ``mmgate`` command: ``serve`` (the gateway), ``sim`` (the embedded engine alone) and
``bench`` (the multimodal session benchmark).

Each subcommand's flags live beside its program (``add_arguments``/``run`` pairs, generated from
its settings model); this module only dispatches. Every flag reads its default from
``MMGATE_<FLAG>`` when set (``mmgate._env``). Nothing imports this module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mmgate import __version__
from mmgate._settings import ConfigError


def build_parser() -> argparse.ArgumentParser:
    from mmgate.bench import cli as bench_cli
    from mmgate.serve import cli as serve_cli
    from mmgate.sim import cli as sim_cli

    parser = argparse.ArgumentParser(
        prog="mmgate",
        description="Multimodal-aware gateway for OpenAI-compatible LLM serving (vLLM first).",
    )
    parser.add_argument("--version", action="version", version=f"mmgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands: list[tuple[str, str, Any]] = [
        ("serve", "run the gateway (embedded engines when no --backend is given)", serve_cli),
        ("sim", "run the embedded vLLM-like engine alone (a stand-in for vLLM, not a model)", sim_cli),
        ("bench", "multimodal session benchmark against any OpenAI-compatible endpoint", bench_cli),
    ]
    for name, help_text, module in commands:
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        run: Callable[[argparse.Namespace], int] = module.run
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Process-wide, at the edge: no *_created series beside every counter (vLLM does the same).
    from prometheus_client import disable_created_metrics

    disable_created_metrics()
    try:
        return int(args._run(args))
    except ConfigError as exc:
        print(f"mmgate {args.command}: invalid setting {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
