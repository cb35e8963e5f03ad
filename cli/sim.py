"""`sangam sim`: simulate a layout on a workload and print one row per QPS point."""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import nullcontext
from typing import Any

from sangam.config import RunConfig, RunFiles, workload_points
from sangam.layout import parse_mode
from sangam.options import add_options, collect, listed

DEFAULT_GPUS = RunConfig().gpus
MANY_REQUESTS = 20_000  # a point of this many requests takes about 10 s: worth a progress bar


def add_parser(commands: Any, name: str) -> None:
    from sim.options import SimOptions

    parser = commands.add_parser(
        name, help="simulate a layout on a workload (SimPy, profiled iteration times)"
    )
    add_options(parser, RunConfig, defaults={"gpus": None}, default_text={"gpus": str(DEFAULT_GPUS)})
    add_options(parser, RunFiles)
    add_options(parser.add_argument_group("testbed"), SimOptions)


def base_config(args: argparse.Namespace, **fixed: Any) -> RunConfig:
    """The run's config from the shared options; `--gpus` must agree with a mode that names its workers."""
    layout = parse_mode(args.mode, args.gpus or DEFAULT_GPUS)
    if args.mode.strip().lower() != "colocated" and args.gpus is not None and args.gpus != layout.num_workers:
        raise ValueError(f"--mode {args.mode} runs {layout.num_workers} workers, not --gpus {args.gpus}")
    fixed.setdefault("gpus", layout.num_workers)
    return collect(RunConfig, args, qps=RunConfig().qps, **fixed)


def run(args: argparse.Namespace) -> int:
    from cli.progress import bar
    from profiles.analytic import AnalyticCostModel
    from profiles.store import default_cost_model
    from sangam.hardware import lookup_gpu, lookup_model
    from sangam.report import print_sim_table
    from sim.options import SimOptions
    from sim.points import run_points

    base = base_config(args)
    options = collect(SimOptions, args)
    if options.cost == "profile":
        cost, cost_name, profile = default_cost_model(base.model, base.gpu)
    else:
        cost, cost_name, profile = (
            AnalyticCostModel(lookup_model(base.model), lookup_gpu(base.gpu)),
            "analytic",
            None,
        )
    if profile is not None and base.pages is None and profile.kv_pages is not None:
        base = dataclasses.replace(base, pages=profile.kv_pages)  # what the live worker has
    points = workload_points(base, listed(args, "qps", base.qps))
    requests = sum(len(rows) for _, rows in points)
    with bar("sim", "requests") if len(points) > 1 or requests >= MANY_REQUESTS else nullcontext() as watch:
        results = run_points(points, cost, cost_name, options, collect(RunFiles, args), watch)
    print_sim_table([r.summary for r in results])
    return 0
