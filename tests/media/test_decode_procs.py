"""Decodes in worker processes (``DecodeProcesses``), with real forkserver workers and real costly
images (a progressive JPEG of 90 repeated scans: under the structure check's limit, still ~0.25 s
of Pillow's CPU): results and refusals come back, a cancelled or overlong decode is killed at once,
a slow one drops to the lowest CPU priority, and one tenant's costly decodes leave another tenant
a worker."""

from __future__ import annotations

import asyncio
import contextlib
import io
import multiprocessing
import os
import random
import threading
import time
from collections.abc import AsyncIterator

import pytest
from PIL import Image

from mmgate.errors import ImageTooLargeError, UnsupportedImageError
from mmgate.media.decode_procs import DecodeProcesses
from mmgate.media.decode_worker import Worker
from tests.support.bombs import many_scans, progressive_jpeg

FORMATS = ("JPEG", "PNG")
SLOW = many_scans(90, 2000)  # ~0.25 s of decode on an idle core
SMALL = progressive_jpeg(64)


# Decode workers of other tests' pools (in-process gateways) still alive when a test starts: not its own.
_OTHERS: set[int | None] = set()


def workers_alive() -> list[multiprocessing.process.BaseProcess]:
    """This test's decode workers: the live ones, less those alive before it started."""
    return [p for p in multiprocessing.active_children() if p.name == "mmgate-decode" and p.pid not in _OTHERS]


def pids_alive() -> set[int | None]:
    return {p.pid for p in workers_alive()}


async def wait_until(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def make_pool() -> AsyncIterator[type[DecodeProcesses]]:
    pools: list[DecodeProcesses] = []
    _OTHERS.clear()
    with contextlib.suppress(AssertionError):  # an earlier test's workers may still be ending: give them a while
        await wait_until(lambda: not workers_alive(), timeout_s=2.0)
    _OTHERS.update(p.pid for p in workers_alive())  # still alive: another pool's, not counted

    started: list[multiprocessing.process.BaseProcess] = []  # every worker this test's pools started

    def factory(*args: object, **kwargs: object) -> DecodeProcesses:
        pool = DecodeProcesses(*args, **kwargs)  # type: ignore[arg-type]
        start = pool._start

        def recorded() -> Worker:
            worker = start()
            started.append(worker.process)
            return worker

        pool._start = recorded  # type: ignore[method-assign]
        pools.append(pool)
        return pool

    yield factory  # type: ignore[misc]
    for pool in pools:
        pool.close()
    # This test's pools leave no worker behind (another test's in-process gateway may meanwhile
    # have started decode workers of its own in this process: not counted).
    await wait_until(lambda: not any(p.is_alive() for p in started))
    _OTHERS.clear()


async def test_results_and_refusals_come_back(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    info = await pool.validate(None, SMALL, FORMATS, 10**6, pixels=64 * 64)
    assert (info.format, info.width, info.height) == ("JPEG", 64, 64)
    with pytest.raises(UnsupportedImageError, match="corrupt or truncated"):
        await pool.validate(None, SMALL[: len(SMALL) // 2], FORMATS, 10**6, pixels=64 * 64)
    with pytest.raises(ImageTooLargeError, match="pixel limit"):
        await pool.validate(None, SMALL, FORMATS, 100, pixels=64 * 64)
    # One worker did all three in turn (counted by the pool: another test's gateway may start its
    # own decode workers in this process meanwhile).
    assert pool.abandoned == 0 and pool.live_workers == 1


async def test_a_cancelled_decode_is_killed(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    decode = asyncio.create_task(pool.validate("t-a", SLOW, FORMATS, 10**8, pixels=2000 * 2000))
    await wait_until(lambda: len(workers_alive()) == 1)
    (pid,) = pids_alive()
    await asyncio.sleep(0.1)
    decode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await decode
    await wait_until(lambda: pid not in pids_alive(), timeout_s=0.3)  # the work stopped, not just the wait
    assert pool.abandoned == 1
    await wait_until(lambda: len(pool._idle) == 1)  # its replacement waits for the next decode
    assert (await pool.validate("t-a", SMALL, FORMATS, 10**6, pixels=64 * 64)).width == 64  # a fresh worker serves on


async def test_a_decode_past_the_time_limit_is_refused_and_killed(make_pool: type[DecodeProcesses]) -> None:
    unlimited = make_pool(1, time_limit_s=30, slow_after_s=30)
    started = time.monotonic()
    await unlimited.validate(None, SLOW, FORMATS, 10**8, pixels=2000 * 2000)
    whole_decode_s = time.monotonic() - started
    unlimited.close()
    await wait_until(lambda: not workers_alive())
    pool = make_pool(1, time_limit_s=0.1, slow_after_s=10)
    await pool.validate(None, SMALL, FORMATS, 10**6, pixels=64 * 64)  # a worker started
    (pid,) = pids_alive()
    started = time.monotonic()
    with pytest.raises(UnsupportedImageError, match=r"took more than 0\.1 s"):
        await pool.validate(None, SLOW, FORMATS, 10**8, pixels=2000 * 2000)
    assert time.monotonic() - started < whole_decode_s  # refused before the decode could have ended
    await wait_until(lambda: pid not in pids_alive(), timeout_s=0.3)
    assert pool.abandoned == 1


async def test_a_slow_decode_drops_to_the_lowest_priority(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(1, time_limit_s=30, slow_after_s=0.05)
    decode = asyncio.create_task(pool.validate(None, SLOW, FORMATS, 10**8, pixels=2000 * 2000))
    await wait_until(lambda: len(workers_alive()) == 1)
    pid = workers_alive()[0].pid
    assert pid is not None
    await wait_until(lambda: os.getpriority(os.PRIO_PROCESS, pid) == 19, timeout_s=2.0)
    assert (await decode).width == 2000
    await wait_until(lambda: pid not in pids_alive(), timeout_s=1.0)  # replaced, not reused at priority 19
    await wait_until(lambda: len(pool._idle) == 1)
    assert os.getpriority(os.PRIO_PROCESS, pool._idle[0].process.pid or 0) == os.getpriority(os.PRIO_PROCESS, 0)


async def test_one_tenants_costly_decodes_leave_another_a_worker(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    done: list[str] = []

    async def run(tenant: str, data: bytes, name: str) -> None:
        await pool.validate(tenant, data, FORMATS, 10**8, pixels=2000 * 2000)
        done.append(name)

    flood = [asyncio.create_task(run("t-a", SLOW, f"a{i}")) for i in range(3)]
    await asyncio.sleep(0.05)
    await run("t-b", SMALL, "b")
    assert done == ["b"]  # B's small image did not wait for any of A's costly ones
    await asyncio.gather(*flood)
    assert done == ["b", "a0", "a1", "a2"]


def test_big_images_under_uvloop() -> None:
    """uvloop makes a socket it watches non-blocking: images bigger than a socket buffer must still
    reach a reused worker whole (the gateway runs on uvloop)."""
    uvloop = pytest.importorskip("uvloop")
    buf = io.BytesIO()
    Image.frombytes("RGB", (600, 600), random.Random(1).randbytes(600 * 600 * 3)).save(buf, "PNG", compress_level=0)
    big = buf.getvalue()
    assert len(big) > 1 << 20  # several times a local socket's buffer

    async def main() -> list[int]:
        pool = DecodeProcesses(1, time_limit_s=30, slow_after_s=10)
        try:
            return [(await pool.validate(None, big, FORMATS, 10**8, pixels=600 * 600)).width for _ in range(3)]
        finally:
            pool.close()

    assert uvloop.run(main()) == [600, 600, 600]


async def test_a_decode_past_its_cpu_budget_is_refused_and_killed(make_pool: type[DecodeProcesses]) -> None:
    reasons: list[str] = []
    # Far tighter than the gateway's (so a real sub-limit bomb crosses it): 0.05 s + 10 ns a pixel.
    pool = make_pool(1, time_limit_s=30, slow_after_s=30, cpu_budget_s=lambda pixels: 0.05 + 10e-9 * pixels,
                     on_abandon=reasons.append)
    assert (await pool.validate(None, SMALL, FORMATS, 10**6, pixels=64 * 64)).width == 64  # within its budget
    (pid,) = pids_alive()
    cpu_before = pool._idle[0].cpu_seconds()
    assert cpu_before is not None
    with pytest.raises(UnsupportedImageError, match="far more to decode than its 4000000 pixels justify"):
        await pool.validate(None, SLOW, FORMATS, 10**8, pixels=2000 * 2000)
    await wait_until(lambda: pid not in pids_alive(), timeout_s=0.3)  # the work stopped, not just the wait
    assert reasons == ["cpu_budget"] and pool.abandoned == 1
    # The same bomb fits a budget of its own size: the refusal came from the budget, not the image.
    pool.cpu_budget_s = lambda pixels: 30.0
    assert (await pool.validate(None, SLOW, FORMATS, 10**8, pixels=2000 * 2000)).width == 2000
    assert reasons == ["cpu_budget"]


async def test_start_readies_every_worker_and_no_decode_starts_another(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(3, time_limit_s=30, slow_after_s=10)
    assert await pool.start(30) == 3
    started = pids_alive()
    assert len(started) == 3 and pool.live_workers == 3
    assert await pool.start(30) == 3  # again: nothing more
    results = await asyncio.gather(*(pool.validate(None, SMALL, FORMATS, 10**6, pixels=64 * 64) for _ in range(5)))
    assert [info.width for info in results] == [64] * 5
    assert pids_alive() == started and pool.live_workers == 3  # the decodes ran in the started ones


async def test_a_worker_that_fails_to_start_is_logged_and_decodes_start_their_own(
        make_pool: type[DecodeProcesses], caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    start = pool._start
    failures = [OSError("Resource temporarily unavailable")] * 2

    def failing() -> Worker:
        if failures:
            raise failures.pop()
        return start()

    pool._start = failing  # type: ignore[method-assign]
    assert await pool.start(30) == 0
    assert caplog.text.count("could not start an image decode process") == 2
    assert pool.live_workers == 0
    assert (await pool.validate(None, SMALL, FORMATS, 10**6, pixels=64 * 64)).width == 64  # the lazy path
    assert pool.live_workers == 1


async def test_start_waits_at_most_its_timeout(make_pool: type[DecodeProcesses]) -> None:
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    start = pool._start
    go = threading.Event()

    def stuck() -> Worker:  # a start that hangs (a forkserver that never answers) until released
        go.wait(30)
        return start()

    pool._start = stuck  # type: ignore[method-assign]
    began = time.monotonic()
    assert await pool.start(0.2) == 0
    assert time.monotonic() - began < 10  # returned at its deadline, not when the starts ended
    go.set()
    await wait_until(lambda: len(pool._idle) == 2, timeout_s=30)  # they join the pool once up
    assert pool.live_workers == 2


async def test_a_started_worker_has_done_its_start_before_it_is_handed_out(make_pool: type[DecodeProcesses]) -> None:
    # Under pytest the main script is pytest's: each child imports it as it starts (CPython 3.11's
    # forkserver does not preload a main script). That CPU must be spent before the worker is
    # handed out, or a small image's first decode is charged with it (and refused as too costly).
    pool = make_pool(2, time_limit_s=30, slow_after_s=10)
    assert await pool.start(30) == 2
    before = [w.cpu_seconds() for w in pool._idle]
    await asyncio.sleep(0.5)
    assert [w.cpu_seconds() for w in pool._idle] == before  # idle: nothing left of its start
