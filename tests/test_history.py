"""Commit subjects say what changed in at most ``MAX_SUBJECT`` characters; the why and the figures
go in the body (CONTRIBUTING.md). Read from git for the commits after ``SINCE`` (older ones stay
as they are); skipped where the checkout holds no such history (a shallow clone, an export)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_SUBJECT = 72
SINCE = "409ed89"  # the last commit before this check


def too_long(log: str) -> list[str]:
    """The lines of ``git log --format='%h %s'`` whose subject is over ``MAX_SUBJECT``."""
    return [line for line in log.splitlines() if len(line.partition(" ")[2]) > MAX_SUBJECT]


def test_commit_subjects_fit() -> None:
    try:
        log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%h %s", f"{SINCE}..HEAD"],
                             capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no git on this machine")
    if log.returncode != 0:
        pytest.skip(f"no history back to {SINCE} in this checkout: {log.stderr.strip()[:200]}")
    long = too_long(log.stdout)
    assert not long, f"subjects over {MAX_SUBJECT} characters (reword them: git rebase -i): {long}"


def test_a_long_subject_is_caught() -> None:
    fits = "a" * MAX_SUBJECT
    assert too_long(f"1234567 {fits}\n89abcde {fits}b\n") == [f"89abcde {fits}b"]
