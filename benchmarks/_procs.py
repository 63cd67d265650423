"""Helpers for benchmarks: start mmgate processes on loopback, wait for them, read their CPU time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MMGATE = [sys.executable, "-m", "mmgate"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], port: int, *, health: str = "/health", timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
    """Start ``mmgate ARGS`` and wait until ``health`` answers 200 on 127.0.0.1:port."""
    proc = subprocess.Popen([*MMGATE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"mmgate {' '.join(args)} exited: {err[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"mmgate {' '.join(args)} did not come up on port {port}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
