"""`mmgate serve` command-line flags (placeholder until the component lands)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags."""


def run(args: argparse.Namespace) -> int:
    print("mmgate serve: not implemented yet")
    return 1
