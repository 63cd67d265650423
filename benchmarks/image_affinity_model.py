"""An event model of ``benchmarks/image_affinity.py``: the same workload through the real
``RoutingPolicy`` (one per gateway, each with its own history, popularity and ``FleetLoad``), with
no processes, no engines and no CPU noise. Seconds per configuration instead of minutes, to try a
policy change before measuring it for real; its figures are the model's, not measurements.

The model: ``--concurrency`` sessions at once, turns in order, turn t of session s through gateway
(s + t) mod G; a request holds its backend for 60 ms + 20 ms per image processed there + 10 ms
per request already in flight there + an exponential 30 ms. An engine holds every image it
processed (nothing is evicted) and, as vLLM, processes a request's images one request at a time
(no duplicate processing of concurrent requests). With G > 1 each gateway polls the true load
every 0.2 s (phases staggered) into a ``FleetLoad``, as ``LoadPoller`` does. With ``--sync`` (the
routing sync, ``mmgate.routing.sync``) the gateways share one history and popularity and each
adds the others' in-flight counts as of their last message (every 10 ms) to its own. Reported: processed /
unique (medians over ``--runs`` seeds), imbalance (time-weighted max / mean in flight, at least B in
flight), load spills per run, and the copies of images some backend already held, by the
decision's reason.

``--mode greedy-oracle`` is a reference no router can be: one router that sees every engine's
held images and true load sends each request to the backend, among those under the bounded-load
cap (true in-flight counts), that processes the fewest images another backend already holds,
ties to the less loaded. It knows the present, not the future (the offline bound,
``benchmarks/image_affinity_bound.py``, knows both).

    .venv/bin/python benchmarks/image_affinity_model.py --backends 4 --gateways 1,3
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_affinity import add_workload_args, workload
from mmgate.routing.history import ImageHistory
from mmgate.routing.load import FleetLoad
from mmgate.routing.policy import Decision, RoutingPolicy, bounded_capacity
from mmgate.routing.popularity import ImagePopularity
from mmgate.routing.weights import RoutedImage

POLL_S = 0.2
SYNC_S = 0.01  # the sync: a change at once, then at most one message per 10 ms (modelled as every 10 ms)
HEARTBEAT_S = 1.0 / 3  # and at least every third of --routing-sync-max-age (1 s) while busy
ORACLE = "greedy-oracle"


def oracle(images: list[RoutedImage], held: list[set[str]], truth: list[int], load_factor: float) -> Decision:
    """``--mode greedy-oracle`` (see the module docstring)."""
    cap = bounded_capacity(truth, load_factor)
    room = [b for b in range(len(truth)) if truth[b] + 1 <= cap]

    def again(b: int) -> int:
        return sum(1 for i in images if i.key not in held[b] and any(i.key in h for h in held))

    best = min(room, key=lambda b: (again(b), truth[b], b))
    return Decision([best, *(b for b in range(len(truth)) if b != best)], "image_affinity")


def run(args: argparse.Namespace, gateways: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    sessions = workload(args)
    names = [f"vllm-{i}" for i in range(args.backends)]
    count = len(names)
    # --sync: one history and popularity for all (messages every SYNC_S are applied at once here)
    # and the others' in-flight counts as of their last message.
    history = ImageHistory()
    popularity = ImagePopularity(args.replicate_share) if args.replicate_share > 0 else None
    policies = [RoutingPolicy(
        "image-affinity" if args.mode == ORACLE else args.mode, load_factor=args.load_factor, held_weight=args.held_weight, rng=random.Random(seed + g),
        history=history if args.sync else ImageHistory(),
        popularity=popularity if args.sync else ImagePopularity(args.replicate_share) if args.replicate_share > 0 else None,
        held_balance=args.held_balance, load_rounding=args.load_rounding) for g in range(gateways)]
    said = [[0] * count for _ in range(gateways)]
    said_at = [0.0] * gateways
    started = [False] * gateways
    next_say = 0.0
    fleets = [FleetLoad(2 * POLL_S + 0.25) for _ in range(gateways)]
    next_poll = [POLL_S * g / gateways for g in range(gateways)]
    own = [[0] * count for _ in range(gateways)]
    held: list[set[str]] = [set() for _ in range(count)]
    processed, spills, copies, held_total = 0, 0, Counter[str](), 0.0
    queue = list(range(len(sessions)))
    # (time, sequence, session, turn, gateway and backend of the request that ends now or -1)
    events: list[tuple[float, int, int, int, int, int]] = []
    for seq in range(min(args.concurrency, len(queue))):
        heapq.heappush(events, (rng.random() * 0.01, seq, queue.pop(0), 0, -1, -1))
    seq = len(events)
    weighted_max = weighted_mean = last = 0.0
    while events:
        now, _, sid, turn, gw_done, b_done = heapq.heappop(events)
        truth = [sum(o[b] for o in own) for b in range(count)]
        if sum(truth) >= count:
            weighted_max += max(truth) * (now - last)
            weighted_mean += sum(truth) / count * (now - last)
        last = now
        while args.sync and next_say <= now:
            for h in range(gateways):
                # --lazy-ends: a gateway says its loads when it routed (or every max age / 3, or
                # when it has gone idle); a request's end alone waits for that.
                if (not args.lazy_ends or started[h] or next_say - said_at[h] >= HEARTBEAT_S
                        or (not any(own[h]) and said[h] != own[h])):
                    said[h], said_at[h], started[h] = list(own[h]), next_say, False
            next_say += SYNC_S

        def seen(g: int, b: int, said: list[list[int]] = said) -> int:
            return own[g][b] + sum(said[h][b] for h in range(gateways) if h != g) if args.sync else own[g][b]

        for g in range(gateways):
            while next_poll[g] <= now:
                for b in range(count):
                    fleets[g].record(names[b], truth[b], seen(g, b), next_poll[g])
                fleets[g].end_round(next_poll[g])
                next_poll[g] += POLL_S
        if b_done >= 0:
            own[gw_done][b_done] -= 1
        if turn >= len(sessions[sid]):
            if queue:
                heapq.heappush(events, (now, seq, queue.pop(0), 0, -1, -1))
                seq += 1
            continue
        g = (sid + turn) % gateways
        session = None if args.sessionless else f"session-{sid}"
        images = [RoutedImage(n, 256.0) for n in sessions[sid][turn]]
        fleet = [fleets[g].estimate(names[b], seen(g, b), now) for b in range(count)] if gateways > 1 else None
        if args.mode == ORACLE:
            decision = oracle(images, held, truth, args.load_factor)
        else:
            decision = policies[g].decide(names, [seen(g, b) for b in range(count)], session, images, fleet)
        b = decision.order[0]
        spills += decision.reason == "load_spill"
        new = [i.key for i in images if i.key not in held[b]]
        copies[decision.reason] += sum(1 for k in new if any(k in h for h in held))
        processed += len(new)
        held[b].update(new)
        policies[g].history.record(names[b], [i.key for i in images], session)
        if policies[g].popularity is not None:
            policies[g].popularity.observe(i.key for i in images)
        own[g][b] += 1
        started[g] = True
        hold_s = 0.06 + 0.02 * len(new) + 0.01 * truth[b] + rng.expovariate(1 / 0.03)
        held_total += hold_s
        heapq.heappush(events, (now + hold_s, seq, sid, turn + 1, g, b))
        seq += 1
    unique = len({n for s in sessions for t in s for n in t})
    requests = sum(len(s) for s in sessions)
    return {"processed_per_unique": processed / unique, "imbalance": weighted_max / weighted_mean,
            "mean_hold_ms": 1000 * held_total / requests, "makespan_s": last,
            "spills": spills, **{f"copies_{k}": v for k, v in copies.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    parser.add_argument("--sessionless", action="store_true")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--gateways", default="1,3")
    parser.add_argument("--mode", default="image-affinity", help=f"a routing mode, or {ORACLE} (see above)")
    parser.add_argument("--load-factor", type=float, default=1.3)
    parser.add_argument("--load-rounding", choices=("down", "random"), default="down",
                        help="the load cap rounded down or at random (--routing-load-rounding)")
    parser.add_argument("--replicate-share", type=float, default=0.25)
    parser.add_argument("--held-weight", type=float, default=1.2)
    parser.add_argument("--no-held-balance", dest="held_balance", action="store_false")
    parser.add_argument("--sync", action="store_true", help="the routing sync between gateways (every 10 ms)")
    parser.add_argument("--lazy-ends", action="store_true",
                        help="with --sync: a request's end goes with the gateway's next routed request or heartbeat")
    parser.add_argument("--runs", type=int, default=7, help="model seeds per row (medians)")
    args = parser.parse_args()
    for gateways in (int(g) for g in args.gateways.split(",")):
        runs = [run(args, gateways, seed) for seed in range(args.runs)]
        keys = sorted({k for r in runs for k in r})
        figures = {k: statistics.median(r.get(k, 0) for r in runs) for k in keys}
        print(f"B={args.backends} G={gateways} {args.mode}{' sync' if args.sync else ''}"
              f"{' lazy-ends' if args.lazy_ends else ''} c={args.load_factor} "
              f"share={args.replicate_share} "
              f"held-balance={args.held_balance}: " + ", ".join(
                  f"{k} {v:.3f}" if isinstance(v, float) and v < 10 else f"{k} {v:g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
