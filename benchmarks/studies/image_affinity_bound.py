"""The least engine processing any routing can reach on the image-affinity workload under a load cap.

Offline and exact (a small integer program, solved with HiGHS: ``pip install highspy``): given the
whole request list of ``benchmarks/regression/image_affinity.py`` (same flags, same seed), place every image
on a set of backends and every request on one backend that holds all its images, with no backend
taking more than ``--load-factor`` x the mean number of requests; minimise the copies (images
processed). Own images (new each turn) are processed once wherever they go, so only the pool (and
hot) images matter. Counting requests instead of requests in flight relaxes the real cap (which
holds at every moment), and the solver knows the future: no online routing can do better than this.

    .venv/bin/python benchmarks/studies/image_affinity_bound.py --backends 4 --load-factor 1.3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._run import write_results
from benchmarks.regression.image_affinity import add_workload_args, workload


def solve(requests: list[list[str]], backends: int, load_factor: float, time_limit_s: float,
          symmetry_cuts: bool = True) -> dict[str, float]:
    import highspy

    shared = sorted({n for names in requests for n in names if not n.startswith("own-")})
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit_s)
    inf = highspy.kHighsInf
    x = {(i, b): h.addVariable(0, 1, 1.0) for i in range(len(shared)) for b in range(backends)}
    for var in x.values():
        h.changeColIntegrality(var.index, highspy.HighsVarType.kInteger)
    index = {n: i for i, n in enumerate(shared)}
    cap = int(load_factor * len(requests) / backends)
    loads: list[list[highspy.highs_var]] = [[] for _ in range(backends)]
    for names in requests:
        ys = [h.addVariable(0, 1, 0.0) for _ in range(backends)]
        for var in ys:
            h.changeColIntegrality(var.index, highspy.HighsVarType.kInteger)
        h.addRow(1, 1, backends, [v.index for v in ys], [1.0] * backends)
        for b, y in enumerate(ys):
            loads[b].append(y)
            for n in names:
                if n in index:  # y[r,b] <= x[i,b]: the request goes only where its image is
                    h.addRow(-inf, 0, 2, [y.index, x[index[n], b].index], [1.0, -1.0])
    for b in range(backends):
        h.addRow(-inf, cap, len(loads[b]), [v.index for v in loads[b]], [1.0] * len(loads[b]))
    if symmetry_cuts:
        # Backends are interchangeable: order them by their request count (any placement can be
        # renumbered so), and an image in n requests needs ceil(n / cap) copies. Both are valid for
        # every placement and cut the search, so the solver can prove more in the same time.
        for b in range(backends - 1):
            h.addRow(0, inf, 2 * len(requests), [v.index for v in loads[b]] + [v.index for v in loads[b + 1]],
                     [1.0] * len(requests) + [-1.0] * len(requests))
        shown = {n: sum(n in names for names in requests) for n in shared}
        for n, count in shown.items():
            h.addRow(-(-count // cap), inf, backends, [x[index[n], b].index for b in range(backends)], [1.0] * backends)
    h.run()
    info = h.getInfo()
    return {"shared_images": len(shared), "copies": info.objective_function_value,
            "lower_bound": info.mip_dual_bound, "gap": info.mip_gap, "request_cap": cap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--load-factor", default="1.3,1.6,2.0,4.0")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    parser.add_argument("--no-cuts", dest="cuts", action="store_false",
                        help="without the symmetry-breaking and copy-count cuts (the model as first solved)")
    parser.add_argument("--out", default="results/image_affinity_bound.json")
    args = parser.parse_args()
    sessions = workload(args)
    requests = [names for turns in sessions for names in turns]
    unique = len({n for names in requests for n in names})
    rows = []
    for c in (float(v) for v in args.load_factor.split(",")):
        result = solve(requests, args.backends, c, args.time_limit, args.cuts)
        processed = result["copies"] + (unique - result["shared_images"])
        rows.append({"load_factor": c, **result, "unique_images": unique, "processed": processed,
                     "processed_per_unique": processed / unique,
                     "processed_per_unique_lower_bound": (result["lower_bound"] + unique - result["shared_images"]) / unique})
    print(f"{len(requests)} requests, {unique} unique images ({rows[0]['shared_images']} shared), "
          f"{args.backends} backends")
    print(f"{'cap c':>6}{'requests/backend':>18}{'copies':>8}{'processed/unique':>18}{'(proven >=)':>12}")
    for r in rows:
        print(f"{r['load_factor']:>6.1f}{r['request_cap']:>18}{r['copies']:>8.0f}{r['processed_per_unique']:>17.3f}x"
              f"{r['processed_per_unique_lower_bound']:>11.3f}x")
    out = Path(args.out)
    write_results(out, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
