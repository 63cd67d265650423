"""A benchmark ended by SIGTERM stops the servers it started (``benchmarks._run``), run as a user
runs it: a script as a process, a real child process, a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_benchmark_stopped_by_sigterm_stops_what_it_started(tmp_path: Path) -> None:
    """A script that parses its flags with ``benchmarks._run.parse_args`` and starts a server in a
    ``try``/``finally``, ended by SIGTERM (``timeout``, ``kill``): the ``finally`` runs, the server
    is gone, the status is 143. Without the handler the child outlives the script."""
    script = tmp_path / "bench.py"
    script.write_text(
        "import argparse, subprocess, sys, time\n"
        "from benchmarks._run import parse_args\n"
        "parse_args(argparse.ArgumentParser(), {})\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "try:\n"
        "    print(child.pid, flush=True)  # inside the try: the signal cannot come before it\n"
        "    time.sleep(60)\n"
        "finally:\n"
        "    child.terminate()\n"
        "    child.wait()\n")
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert run.stdout is not None
    child = int(run.stdout.readline())
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=20) == 143
    assert not Path(f"/proc/{child}").exists(), "the script's child outlived it"
