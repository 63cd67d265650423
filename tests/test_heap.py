"""glibc's heap keeps request-sized buffers (``mmgate.heap``): measured in a fresh interpreter, by
the page faults a loop of agent-sized allocations takes with and without the tuning."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHURN = """
import resource, sys
from mmgate.heap import keep_request_buffers
tuned = keep_request_buffers() if sys.argv[1] == "tuned" else None
texts = [("A" * 200_000)[:-1] + chr(65 + i % 26) for i in range(100)]
body = b"B" * 800_000
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for text in texts:
    joined = b"".join([body[:400_000], body[400_000:]])
    raw = text.encode("ascii")
    copy = raw + b"x"
    del joined, raw, copy
print(tuned, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(texts))
"""


def faults_per_iteration(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    tuned, faults = out.stdout.split()
    return tuned, float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_request_sized_buffers_stop_faulting_once_tuned() -> None:
    tuned, faults = faults_per_iteration("tuned")
    if tuned != "True":
        pytest.skip("not glibc (musl?): mmgate leaves the allocator alone")
    _, plain = faults_per_iteration("plain")
    assert plain > 50, f"glibc's defaults fault these buffers in every time ({plain:.0f} a loop)"
    assert faults < 10, f"tuned: {faults:.0f} faults a loop (default {plain:.0f})"
