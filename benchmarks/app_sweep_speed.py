"""Explorer sweep speed: 3 layouts x 10 rates x 2000 requests (LLaDA-8B, ShareGPT, 8 H100s), as the app
runs it (worker processes, no cache), and what one point's result weighs in the page's cache (pickled, as
`st.cache_data` keeps it) per 1,000 requests.

Run: python -m benchmarks.app_sweep_speed [--workers N] [--requests N] [--cost profile|analytic].
Target: < 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import pickle
import time

from app.sweep import COSTS, WORKERS, point_specs, resolve, run_sweep
from runs.config import RunConfig

LAYOUTS = ("8C", "5P3D", "3P5C")
RATES = tuple(float(q) for q in range(4, 14))  # 4..13 QPS: from light load to past every knee


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cost", choices=COSTS, default="profile")
    args = parser.parse_args()
    setup = resolve(RunConfig(num_requests=args.requests), args.cost)
    specs = point_specs(setup, LAYOUTS, RATES, (0,))
    started = time.perf_counter()
    results = run_sweep(specs, workers=args.workers)
    wall = time.perf_counter() - started
    sim = sum(r.sim_wall_s for r in results)
    print(
        f"{len(results)} points x {args.requests} requests on {args.workers} processes "
        f"({results[0].summary['cost_model']} iteration times): {wall:.1f} s wall "
        f"({sim:.1f} s of simulation, {sim / wall:.2f}x parallel)"
    )
    cached = max(len(pickle.dumps(r)) for r in results)
    per_request = cached / args.requests
    print(f"a point in the page's cache: {cached / 1e3:.0f} kB ({per_request:.0f} bytes a request)")


if __name__ == "__main__":
    main()
