"""Errors of ``mmgate bench``, a separate program with a tree of its own (not the gateway's).

    BenchError                the benchmark cannot start or go on: CLI prints it, exit status 2
    ├── DatasetError          a dataset line is unusable: names the file, line and field
    └── ResultFileError       a results JSON given to ``compare`` is missing or malformed

Failed requests during a run are *not* exceptions: they are counted as errors in the results.
"""

from __future__ import annotations

from pathlib import Path


class BenchError(Exception):
    """The benchmark cannot start or continue (bad flag value, endpoint unreachable, bad file)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class DatasetError(BenchError):
    """A dataset line is unusable. ``str()`` is ``FILE:LINE: FIELD: what is wrong``."""

    def __init__(self, path: Path | str, line: int, field: str, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        super().__init__(f"{self.path}:{line}: {field}: {message}", param=field)


class ResultFileError(BenchError):
    """A results file (``summary.json``) cannot be read or is not one of ours."""
