"""The fleet under faults: 3 gateway processes, engines found through DNS, a 3-master Redis Cluster,
and a steady multi-session image workload with uuid references spread over the gateways as a
Kubernetes Service would, while (a) each gateway in turn gets SIGTERM and is restarted, (b) one gets
SIGKILL under long streams, (c) a replica is added and one removed through DNS, (d) a Redis master is
killed and restarted. Prints one row per phase (what the clients saw) and writes JSON.

    .venv/bin/python benchmarks/regression/fleet_faults.py --out results/fleet_faults.json
    .venv/bin/python benchmarks/regression/fleet_faults.py --vllm          # 2 real vLLM replicas (+1 spare)

The aims (issue 21): rolling restart 0 failed requests and 0 cache misses reaching clients; SIGKILL
fails only the requests in flight on that gateway; a DNS add or removal moves at most 1/N of the
sessions (plus the removed replica's), none needlessly; a Redis node kill fails nothing. A cache
miss a backend reports is healed by the gateway (the ``healed`` column); one that reached a client
would be a failed request.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.fleet import faults
from tests.fleet.harness import running_fleet
from tests.fleet.workload import Service, SessionWorkload

from benchmarks._run import parse_args, write_results
from benchmarks._table import Column, print_table

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
QUICK = {"sessions": 8, "concurrency": 4, "phase_seconds": 1.0, "max_tokens": 4, "speedup": 1000.0}

COLUMNS = [
    Column("phase", 34, lambda r: str(r["phase"]), left=True),
    Column("s", 7, lambda r: f"{r['seconds']:.1f}"),
    Column("requests", 10, lambda r: str(r["requests"])),
    Column("failed", 8, lambda r: str(r["failed"])),
    Column("healed", 8, lambda r: str(r["healed"])),
    Column("p50 ms", 9, lambda r: f"{r['p50_ms']:.1f}"),
    Column("p99 ms", 9, lambda r: f"{r['p99_ms']:.1f}"),
    Column("  detail", 60, lambda r: "  " + detail(r), left=True),
]


def detail(row: dict[str, Any]) -> str:
    if "in_flight_at_kill" in row:
        return f"in flight at kill {row['in_flight_at_kill']} (long streams {row['long_streams']}), " \
               f"failed of them {row['failed_in_flight']}"
    if "moved" in row:
        return f"{row['backends']} backends after {row['converged_s']} s; moved {row['moved']}/{row['sessions']} " \
               f"sessions, needlessly {row['moved_needlessly']}"
    if "exit_codes" in row:
        return f"exit statuses {row['exit_codes']}"
    return ""


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="fleet-faults-"))
    fleet_cm = running_fleet(workdir, addresses=(A, B), spare=(C,), vllm=args.vllm, speedup=args.speedup)
    fleet = await asyncio.to_thread(fleet_cm.__enter__)
    phases: list[faults.PhaseResult] = []
    try:
        workload = SessionWorkload(Service([g.url for g in fleet.gateways]), sessions=args.sessions,
                                   concurrency=args.concurrency, model=fleet.model, max_tokens=args.max_tokens)
        running = asyncio.create_task(workload.run())
        hold = args.phase_seconds
        try:
            phases.append(await faults.steady(workload, hold, "steady (no fault)"))
            phases.append(await faults.rolling_restart(fleet, workload, settle_s=hold / 2))
            phases.append(await faults.sigkill(fleet, workload, settle_s=hold / 2,
                                               stream_tokens=400 if args.vllm else 4000))
            phases.append(await faults.dns_change(fleet, workload, (A, B, C), "replica added (DNS)", hold))
            phases.append(await faults.dns_change(fleet, workload, (B, C), "replica removed (DNS)", hold))
            phases.append(await faults.redis_node_kill(fleet, workload, down_s=hold / 2, settle_s=hold / 2))
            phases.append(await faults.steady(workload, hold, "steady (after)"))
        finally:
            workload.stop.set()
            await running
    finally:
        await asyncio.to_thread(fleet_cm.__exit__, None, None, None)
    rows = [p.row() for p in phases]
    print_table(COLUMNS, rows)
    return {"engines": "vllm" if args.vllm else f"sim (speedup {args.speedup:g})", "gateways": 3,
            "redis": "cluster of 3 masters", "sessions": args.sessions, "concurrency": args.concurrency,
            "phase_seconds": args.phase_seconds, "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "phases": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/fleet_faults.json")
    parser.add_argument("--vllm", action="store_true", help="2 real vLLM replicas (MMGATE_VLLM_VENV, MMGATE_VLLM_MODEL)")
    parser.add_argument("--sessions", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8, help="sessions talking at once")
    parser.add_argument("--phase-seconds", type=float, default=5.0, help="how long each phase is observed")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--speedup", type=float, default=20.0, help="the sim engines' speedup")
    args = parse_args(parser, QUICK)
    result = asyncio.run(run(args))
    write_results(args.out, result)


if __name__ == "__main__":
    main()
