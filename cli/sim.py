"""`sangam sim`: simulate a layout on a workload and print one row per QPS point."""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import nullcontext
from typing import Any

from runs.config import RunConfig, RunFiles, workload_points
from runs.options import add_options, collect, declared, listed
from sangam.layout import parse_mode

DEFAULT_GPUS = RunConfig().gpus
MANY_REQUESTS = 20_000  # a point of this many requests takes about 10 s: worth a progress bar
# The options a testbed sets when they are not given: absent flags parse as None
TESTBED_DEFAULTS: dict[str, Any] = {
    "gpu": None,
    "control_ms": None,
    "handoff_ms": None,
    "link_gbps": None,
    "link_latency_ms": None,
}


def add_parser(commands: Any, name: str) -> None:
    from sim.options import SimOptions

    parser = commands.add_parser(
        name, help="simulate a layout on a workload (SimPy, profiled iteration times)"
    )
    add_options(
        parser, RunConfig, defaults={"gpus": None, "gpu": None},
        default_text={"gpus": str(DEFAULT_GPUS), "gpu": "the testbed's"},
    )  # fmt: skip
    add_options(parser, RunFiles, default_text={"progress": "the testbed's per model and trace"})
    group = parser.add_argument_group("testbed")
    testbeds = {name: "the testbed's" for name in TESTBED_DEFAULTS if name != "gpu"}
    add_options(group, SimOptions, defaults=TESTBED_DEFAULTS, default_text=testbeds)


def base_config(args: argparse.Namespace, **fixed: Any) -> RunConfig:
    """The run's config from the shared options; `--gpus` must agree with a mode that names its workers."""
    layout = parse_mode(args.mode, args.gpus or DEFAULT_GPUS)
    if args.mode.strip().lower() != "colocated" and args.gpus is not None and args.gpus != layout.num_workers:
        raise ValueError(f"--mode {args.mode} runs {layout.num_workers} workers, not --gpus {args.gpus}")
    fixed.setdefault("gpus", layout.num_workers)
    return collect(RunConfig, args, qps=RunConfig().qps, **fixed)


def given_options(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The flags of `cls` as parsed (None where a testbed-set option was not given)."""
    return {f.name: getattr(args, f.name) for f, _ in declared(cls) if hasattr(args, f.name)}


def run(args: argparse.Namespace) -> int:
    from cli.bars import bar
    from cli.trace import check_trace_name, refuse_rate_of_timed_trace
    from profiles.testbeds import choose_testbed
    from runs.report import print_sim_table
    from sim.options import SimOptions
    from sim.points import run_points
    from sim.setup import Resolver

    testbed = choose_testbed(args.testbed, args.gpu)
    files = collect(RunFiles, args)
    setup = Resolver(testbed, given_options(args, SimOptions)).resolve(
        base_config(args, gpu=testbed.gpu), vars(args), files.progress
    )
    base, files = setup.config, dataclasses.replace(files, progress=setup.progress)
    check_trace_name(base.trace)
    refuse_rate_of_timed_trace(base.trace, args.qps)
    points = workload_points(base, listed(args, "qps", base.qps))
    requests = sum(len(rows) for _, rows in points)
    with bar("sim", "requests") if len(points) > 1 or requests >= MANY_REQUESTS else nullcontext() as watch:
        results = run_points(points, setup.cost, setup.cost_name, setup.options, files, watch)
    print_sim_table([r.summary for r in results])
    return 0
