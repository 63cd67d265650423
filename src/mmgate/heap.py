"""The C heap kept for request-sized buffers (glibc only).

Every agent turn allocates and frees a few buffers of 150 KB to 1 MB (the body, its screenshots' base64
text, their bytes, the forwarded body). glibc serves blocks that size with fresh ``mmap`` pages or
trims the heap top back to the kernel on free, so each turn faults the same memory in again.
Raising glibc's mmap and trim thresholds keeps such blocks in the heap, reused without a fault (a
loop of 200 KB and 800 KB buffers: 359 → 2 faults and 876 → 67 µs an iteration,
``tests/test_heap.py``). A trim also keeps ``TRIM_BYTES`` (glibc's top pad), not 128 KiB, so a
heap that trims its top does not fault it in again on the next turns: the gateway on an agent's
turns (``agent_turn_cpu.py``), ~140 → ~98 faults a turn while its image caches fill (the rest is
their growth), ~20 → ~2 once they are full.

What stays is bounded: at most ``TRIM_BYTES`` of free memory at the top of each of at most
``ARENAS`` heaps (the event loop's and the worker threads'), 32 MiB in all; blocks from
``MMAP_BYTES`` up are still mapped and unmapped on their own, so the memory of a large body goes
back to the kernel once it is answered. Elsewhere (musl, macOS) nothing changes. ``mmgate serve``
and each of its image decode processes set it at start, wherever they run (the container image
sets no ``MALLOC_*`` variable of its own).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

MMAP_BYTES = 1 << 20
TRIM_BYTES = 16 << 20
ARENAS = 2
# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def keep_request_buffers() -> bool:
    """Tune glibc's malloc as the module says; False where it is not glibc (nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 -- glibc's own symbol: musl has mallopt as a stub
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, ARENAS), (_M_MMAP_THRESHOLD, MMAP_BYTES), (_M_TRIM_THRESHOLD, TRIM_BYTES),
        (_M_TOP_PAD, TRIM_BYTES)))
