"""`sangam reproduce`: the paper's Figures 5 and 8-12 in the simulator on a testbed, and a table of every
number the paper states in sections 3.3 and 6 beside the simulated one."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

from runs.config import RunConfig
from runs.options import add_options, collect

REQUESTS = 2000  # per point: half the paper's 4000, so that the whole run takes minutes on 2 cores


def add_parser(commands: Any, name: str) -> None:
    from calib.reproduce import ReproduceOptions
    from sim.engines import EngineOptions
    from sim.options import SimOptions

    parser = commands.add_parser(name, help="re-run the paper's Figures 5, 8-12 and its stated numbers")
    add_options(parser, ReproduceOptions)
    add_options(parser, EngineOptions, only=("jobs",))
    add_options(parser, SimOptions, only=("testbed",), default_text={"testbed": "sangam-h100"})
    add_options(parser, RunConfig, only=("num_requests", "seed"), defaults={"num_requests": REQUESTS})


def run(args: argparse.Namespace) -> int:
    from calib.claims import judge, outcome_row, read_claims, write_outcomes
    from calib.figures import PLOTS
    from calib.reproduce import ReproduceOptions, run_tasks, tasks
    from profiles.testbeds import choose_testbed, testbed_path
    from sim.engines import EngineOptions, local_jobs
    from sim.setup import Resolver

    options = collect(ReproduceOptions, args)
    jobs = local_jobs(collect(EngineOptions, args))
    testbed = choose_testbed(args.testbed, None)
    source = args.testbed if args.testbed and testbed_path(args.testbed).is_file() else testbed.name
    out = options.out or Path("results") / f"reproduce-{testbed.name}"
    out.mkdir(parents=True, exist_ok=True)
    figures = list(dict.fromkeys(options.figures))
    claims = [c for c in read_claims() if c.figure in figures]
    work = tasks(source, figures, [p for c in claims for p in c.points], args.num_requests, args.seed)
    resolver = Resolver(testbed)
    for model in sorted({t.key.model for t in work}):  # refused here, before any point runs
        resolver.priced(model)
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total} points", end="", file=sys.stderr, flush=True)

    results = run_tasks(work, jobs, progress)
    wall = time.perf_counter() - started
    if sys.stderr.isatty():
        print(file=sys.stderr)
    title = f"testbed {testbed.name} v{testbed.version}, {args.num_requests} requests per point"
    paths = [path for name in figures for path in PLOTS[name](results, out, title)]
    outcomes = [judge(c, {k: r.summary for k, r in results.items()}) for c in claims]
    write_outcomes(outcomes, out / "claims.csv")
    write_points(results, out / "points.csv")
    print_table([outcome_row(o) for o in outcomes])
    held = [o.holds for o in outcomes if o.holds is not None]
    busy = sum(r.summary["sim_wall_s"] for r in results.values())
    print(
        f"\n{len(work)} points on testbed {testbed.name}, {args.num_requests} requests each, "
        f"seed {args.seed}, in {wall:.0f} s on {jobs} processes ({busy:.0f} s of simulation); "
        f"orderings that hold: {sum(held)} of {len(held)}"
    )
    stems = ", ".join(dict.fromkeys(p.stem for p in paths))
    formats = " and ".join(dict.fromkeys(p.suffix for p in paths))
    print(f"wrote {stems} ({formats}), claims.csv and points.csv to {out}")
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'claim':28} {'sec':4} {'metric':34} {'paper':>8} {'sim':>8} {'ratio':>6} {'holds':>5}")
    for r in rows:
        print(
            f"{r['id']:28} {r['section']:4} {r['metric'][:34]:34} {r['paper']:>8} {r['simulated']:>8} "
            f"{r['ratio']:>6} {r['holds']:>5}"
        )


def write_points(results: Any, path: Path) -> None:
    """One row per simulated point: its key and the headline statistics."""
    stats = ("mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "mean_prefill_queue_ms", "mean_decode_ms",
             "request_throughput", "completed")  # fmt: skip
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layout", "policy", "model", "trace", "budget", "qps", *stats])
        for k, r in sorted(results.items(), key=lambda item: item[0].label()):
            writer.writerow(
                [k.layout, k.policy, k.model, k.trace, k.budget, k.qps, *(r.summary[s] for s in stats)]
            )
