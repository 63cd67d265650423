"""A gateway's Python stacks sampled by py-spy while a benchmark drives it, read back as µs a turn:
by where the time goes (the innermost frame's package: mmgate, aiohttp's server or its client, the
event loop's own C code, Pillow, ...) and by the innermost function.

py-spy samples without pausing the process (``--nonblocking``) and only while its thread runs (a
C call the frame makes counts as that frame's: SHA-256 as ``decoded_digest``, a socket send as
aiohttp's ``_writelines``). It costs the machine a little CPU beside the run, so a profiled run's
CPU figures are for reading the profile, not for comparing with another run. Needs ``py-spy``
(``.venv/bin/pip install py-spy``) and the right to trace the process (root, or ptrace allowed).
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

RATE_HZ = 997  # not a multiple of the kernel's tick, so samples do not lock to it
_FILE = re.compile(r"\(([^()]*?)(?::\d+)?\)$")  # a raw frame: "function (path/to/file.py:LINE)"


def start(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample ``pid`` into ``out`` (py-spy's raw, collapsed stacks) until ``stop``."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return subprocess.Popen([exe, "record", "-p", str(pid), "-r", str(RATE_HZ), "-f", "raw", "-o", str(out),
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the sampling: py-spy writes its file on SIGINT."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _where(frames: list[str]) -> str:
    """The package of the innermost frame, aiohttp's split into server and client."""
    found = _FILE.search(frames[-1])
    path = found.group(1) if found else ""
    if path.endswith("asyncio/runners.py"):
        return "event loop (C)"  # uvloop's own code: polling, socket reads, callbacks
    package = path.split("/", 1)[0] if "/" in path else (path or "(no Python frame)")
    if package in ("aiohttp", "multidict", "yarl"):
        return "aiohttp " + ("client" if any("client" in f for f in frames) else "server")
    return package


def read(path: Path, turns: int, top: int = 25) -> dict[str, Any]:
    """µs a turn by package and for the ``top`` innermost functions of ``path``."""
    by_package: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    # No file: py-spy could not attach (no right to trace it): an empty profile, the run's table stands.
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        by_package[_where(frames)] += int(count)
        by_function[re.sub(r":\d+\)$", ")", frames[-1])] += int(count)
    per_turn = 1e6 / RATE_HZ / max(turns, 1)
    return {"samples": sum(by_package.values()), "turns": turns,
            "by_package_us": {k: round(v * per_turn, 1) for k, v in by_package.most_common()},
            "by_function_us": {k: round(v * per_turn, 1) for k, v in by_function.most_common(top)}}


def print_profile(name: str, profile: dict[str, Any]) -> None:
    print(f"\n{name}: {profile['samples']} samples over {profile['turns']} turns; µs a turn")
    for label, rows in (("by package", profile["by_package_us"]), ("by innermost function", profile["by_function_us"])):
        print(f"  {label}:")
        for key, us in rows.items():
            print(f"    {us:8.1f}  {key}")
