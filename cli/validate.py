"""`sangam validate`: one trace live on the GPU and in the simulator; the simulator's errors."""

from __future__ import annotations

import argparse
from typing import Any

from runs.config import RunConfig
from runs.options import add_options, collect, listed


def add_parser(commands: Any, name: str) -> None:
    from calib.validate import ValidateOptions
    from sim.options import SimOptions

    parser = commands.add_parser(name, help="run one trace live and simulated; report the errors")
    add_options(
        parser, RunConfig, only=("mode", "model", "gpu", "gpus", "qps", "num_requests", "seed"),
        defaults={"gpu": "h200", "gpus": 1, "num_requests": 300},
        default_text={"qps": "30%, 60% and 90% of the simulated knee"},
    )  # fmt: skip
    add_options(parser, ValidateOptions)
    add_options(
        parser, SimOptions, only=("testbed",), default_text={"testbed": "sangam-<gpu>, so sangam-h200"}
    )


def run(args: argparse.Namespace) -> int:
    from calib.validate import ValidateOptions, run_validate

    rates = listed(args, "qps", None) if args.qps is not None else None
    base = collect(RunConfig, args, qps=RunConfig().qps)
    return run_validate(base, rates, collect(ValidateOptions, args), args.testbed)
