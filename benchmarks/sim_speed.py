"""Simulator speed: one 4000-request point per layout (LLaDA-8B, ShareGPT, QPS 7.5, 8 H100 workers,
the default cost model of `sangam sim`).

Run: python -m benchmarks.sim_speed [--repeats N]. Target: <= 2 s per point on one core.
Prints the best wall time of N runs and the process CPU time of that run: on a busy machine the
CPU time is what one otherwise idle core would take.
"""

from __future__ import annotations

import argparse
import time

from profiles.store import default_cost_model
from runs.args import positive_float, positive_int
from runs.config import RunConfig, synthetic_rows
from sangam.cost import CostModel
from sangam.workload import TraceRow
from sim.run import SimResult, simulate

MODES = ("colocated", "5P3D", "5P3C", "3P5C")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--qps", type=positive_float, default=7.5)
    args = parser.parse_args()
    header = ("mode", "wall s", "cpu s", "iterations", "iter/cpu s", "mean e2e s", "p99 e2e s")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (10, 7, 6, 11, 11, 11, 10), strict=True)))
    for mode in MODES:
        cfg = RunConfig(mode=mode, qps=args.qps)
        cost, _, _ = default_cost_model(cfg.model, cfg.gpu)
        rows = synthetic_rows(cfg)
        best = min((timed(cfg, rows, cost) for _ in range(args.repeats)), key=lambda t: t[0])
        wall, cpu, result = best
        s = result.summary
        rate = result.num_iterations / cpu
        print(
            f"{mode:>10} {wall:>7.2f} {cpu:>6.2f} {result.num_iterations:>11} {rate:>11.0f}"
            f" {s['mean_e2el_ms'] / 1000:>11.2f} {s['p99_e2el_ms'] / 1000:>10.2f}"
        )


def timed(cfg: RunConfig, rows: list[TraceRow], cost: CostModel) -> tuple[float, float, SimResult]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(cfg, rows, cost)
    return time.perf_counter() - wall, time.process_time() - cpu, result


if __name__ == "__main__":
    main()
