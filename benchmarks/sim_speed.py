"""Simulator speed: one 4000-request point per layout (LLaDA-8B, ShareGPT, QPS 7.5, 8 workers).

Run: python -m benchmarks.sim_speed [--repeats N]. Target: <= 2 s wall per point on one core.
"""

from __future__ import annotations

import argparse
import statistics

from profiles.analytic import AnalyticCostModel
from sangam.config import RunConfig, synthetic_rows
from sangam.hardware import lookup_gpu
from sim.run import simulate

MODES = ("colocated", "5P3D", "5P3C", "3P5C")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--qps", type=float, default=7.5)
    args = parser.parse_args()
    header = ("mode", "wall s (median)", "iterations", "iter/s", "mean e2e s", "p99 e2e s")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (10, 16, 11, 10, 11, 10), strict=True)))
    for mode in MODES:
        cfg = RunConfig(mode=mode, qps=args.qps)
        cost = AnalyticCostModel(cfg.model_spec, lookup_gpu(cfg.gpu))
        rows = synthetic_rows(cfg)
        runs = [simulate(cfg, rows, cost) for _ in range(args.repeats)]
        wall = statistics.median(r.wall_s for r in runs)
        s = runs[0].summary
        print(
            f"{mode:>10} {wall:>16.2f} {runs[0].num_iterations:>11} {runs[0].num_iterations / wall:>10.0f}"
            f" {s['mean_e2el_ms'] / 1000:>11.2f} {s['p99_e2el_ms'] / 1000:>10.2f}"
        )


if __name__ == "__main__":
    main()
