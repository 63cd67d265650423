"""Helpers for benchmarks: start mmgate processes on loopback, wait for them, read their CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
# The processes a benchmark starts by path (a relay, a zero-latency backend, an OTLP sink).
SERVERS = ROOT / "benchmarks" / "servers"

__all__ = ["CLK_TCK", "MMGATE", "ROOT", "SERVERS", "cpu_seconds", "free_port", "machine_busy_s", "start", "stop",
           "wait_up"]
MMGATE = [sys.executable, "-m", "mmgate"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def start(
    args: list[str], port: int, *, health: str = "/health", timeout_s: float = 60.0,
    command: list[str] | None = None, env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``mmgate ARGS`` (or ``command + ARGS``) and wait until ``health`` answers 200 on
    127.0.0.1:port; ``env``: the process's environment (default: this one's)."""
    # stderr to a file, never an unread pipe: a gateway's access log would fill the pipe and block
    # it. The process keeps its own descriptor of the file once this one is closed.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*(command or MMGATE), *args], stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            wait_up(f"http://127.0.0.1:{port}{health}", proc, timeout_s)
            return proc
        except RuntimeError:
            if proc.poll() is None:
                proc.kill()
                raise RuntimeError(f"mmgate {' '.join(args)} did not come up on port {port}") from None
            log.seek(0)
            err = log.read().decode(errors="replace")
            raise RuntimeError(f"mmgate {' '.join(args)} exited: {err[-2000:]}") from None


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Wait until ``GET url`` answers 200; RuntimeError if ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process has run, all its threads, with nanosecond resolution.

    From ``/proc/PID/task/*/schedstat`` (time on CPU, user and kernel); falls back to the
    tick-based ``/proc/PID/stat`` (10 ms resolution) where schedstat is missing.
    """
    total_ns = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total_ns += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
                continue
        return total_ns / 1e9
    except FileNotFoundError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, every thread (``cpu_seconds``' resolution)."""
    total, pids = 0.0, [pid]
    while pids:
        p = pids.pop()
        try:
            total += cpu_seconds(p)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    pids.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):  # a process or thread that just ended
            continue
    return total


def machine_busy_s() -> float:
    """CPU seconds every core spent busy since boot (all processes), from /proc/stat: user to steal,
    not idle or iowait (guest time is counted in user already)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
