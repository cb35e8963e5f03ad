"""Sweep and search speed (issue 19), with the local engine and no cache:

- grid: the paper's main grid, 2 models x 2 traces x 3 layouts (8C, 5P3D, 5P3C) x 10 rates (2..11 QPS)
  x 4000 requests = 120 points, as `sangam sweep` runs them; target <= 90 s wall on 2 cores;
- search: `sangam search --gpus 8 --layouts all --slo p99_e2el_s=20` (15 layouts, LLaDA-8B, ShareGPT);
  target <= 180 s;
- point: one 4000-request point (LLaDA-8B, ShareGPT, 8C, 7.5 QPS) in this process; target <= 1 s;
- memory: the peak resident set of this process and of the largest worker process; target < 2 GB.

Run: python -m benchmarks.sweep_speed [--part grid|search|point|all] [--jobs N] [--requests N].
The machine's load average is printed with the figures: on a shared machine wall times are inflated.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from contextlib import closing

from runs.args import positive_int
from runs.build import build
from runs.config import RunConfig
from sim.engines import LocalPool
from sim.options import SimOptions
from sim.search import SearchOptions, parse_slo, search
from sim.sweep import Cache, GridOptions, evaluate, grid, run_point

MODELS = ("llada-8b", "dream-7b")
TRACES = ("sharegpt", "arxiv")
LAYOUTS = ("8C", "5P3D", "5P3C")
RATES = tuple(float(q) for q in range(2, 12))
SLO = "p99_e2el_s=20"


def run_grid(jobs: int, requests: int) -> str:
    options = GridOptions(models=MODELS, traces=TRACES, layouts=LAYOUTS)
    points = grid(RunConfig(num_requests=requests), options, RATES, SimOptions(), None)
    cpu = children_cpu()
    started = time.perf_counter()
    with closing(LocalPool(jobs)) as engine:
        evaluate(points, engine, Cache(None))
    wall = time.perf_counter() - started
    cpu = children_cpu() - cpu
    return (
        f"grid: {len(points)} points x {requests} requests on {jobs} processes: {wall:.1f} s wall; "
        f"the workers' CPU {cpu:.1f} s ({cpu / len(points):.2f} s a point, {cpu / jobs:.1f} s a process)"
    )


def run_search(jobs: int, requests: int) -> str:
    options = GridOptions(layouts=("all",))
    configs = grid(RunConfig(num_requests=requests), options, [1.0], SimOptions(), None)
    cpu = children_cpu()
    started = time.perf_counter()
    with closing(LocalPool(jobs)) as engine:
        # granularity 0.1, the former default: the probes the recorded figures timed
        answers = search(configs, [parse_slo(SLO)], [0], engine, Cache(None), SearchOptions(granularity=0.1))
    wall = time.perf_counter() - started
    cpu = children_cpu() - cpu
    probes = sum(len(a.probes) for a in answers)
    best = answers[0]
    return (
        f"search: {len(configs)} layouts, {SLO}, {probes} probes x {requests} requests on {jobs} "
        f"processes: {wall:.1f} s wall, the workers' CPU {cpu:.1f} s ({cpu / jobs:.1f} s a process); "
        f"best {best.point.config.layout.name} at {best.max_qps:g} QPS"
    )


def children_cpu() -> float:
    """CPU seconds of the ended worker processes: on a busy machine, what idle cores would take."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(requests: int, repeats: int = 3) -> str:
    point = grid(RunConfig(num_requests=requests, qps=7.5), GridOptions(), [7.5], SimOptions(), None)[0]
    run_point(point)  # warm: the cost model and imports
    times = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run_point(point)
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    wall, cpu = min(times)
    return f"point: 8C, 7.5 QPS, {requests} requests: {wall:.2f} s wall, {cpu:.2f} s CPU (best of {repeats})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=("grid", "search", "point", "all"), default="all")
    parser.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=positive_int, default=4000)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(f"build: {build()}", flush=True)  # the Python build takes about twice as long a point
    if args.part in ("point", "all"):
        print(run_one(args.requests), flush=True)
    if args.part in ("grid", "all"):
        print(run_grid(args.jobs, args.requests), flush=True)
    if args.part in ("search", "all"):
        print(run_search(args.jobs, args.requests), flush=True)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak memory: this process {own:.0f} MB, the largest worker {child:.0f} MB")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
