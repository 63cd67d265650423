"""A fresh ``mmgate serve`` has its image decode processes running before it accepts requests: when
it first answers, the forkserver (the gateway's child) already has ``--decode-workers`` children,
read from /proc, and the first image request decodes in one of them instead of waiting for one to
start (no new process appears). The processes themselves: ``tests/media/test_decode_procs.py``."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.support.http import post
from tests.support.images import data_url, make_image
from tests.support.serve_process import serve_process


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (field 4 of /proc/PID/stat)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a process that ended meanwhile
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def forkserver(gateway_pid: int) -> int:
    """The gateway's multiprocessing forkserver, the parent of its decode processes."""
    for pid in children(gateway_pid):
        with contextlib.suppress(OSError):
            if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("the gateway has no forkserver: no decode process was started")


async def test_decode_processes_run_before_the_first_request(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--decode-workers", "3") as gw:  # returns once /health answers 200
        server = forkserver(gw.proc.pid)
        workers = children(server)
        assert len(workers) == 3, gw.log()
        image = data_url(make_image("JPEG", 96, 64), "image/jpeg")  # a JPEG: fully decoded (a PNG is not)
        reply = await post(gw.url, {"model": "mmgate-sim-vl", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": image}}]}]})
        assert reply.status == 200, reply.body
        assert children(server) == workers  # decoded in a process that was waiting: none started for it
        assert "image decode processes ready" not in gw.log(None)
