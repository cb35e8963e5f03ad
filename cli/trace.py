"""`sangam trace`: write a synthetic trace file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runs.config import DATASETS, RunConfig
from runs.options import add_options, collect


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="write a synthetic trace file (arrival_time, prompt_len, output_len)"
    )
    add_options(
        parser, RunConfig, only=("trace", "num_requests", "qps", "arrival_cv", "seed"), single=("qps",),
        defaults={"num_requests": 20000},
    )  # fmt: skip
    parser.add_argument("--dataset", dest="trace", help=argparse.SUPPRESS)  # the old name of --trace
    parser.add_argument("-o", "--output", type=Path, required=True, help="the .csv or .jsonl file to write")


def run(args: argparse.Namespace) -> int:
    from runs.config import synthetic_rows
    from runs.traces import write_trace

    cfg = collect(RunConfig, args)
    if not cfg.is_synthetic:
        raise ValueError(f"--trace {cfg.trace}: a synthetic trace is one of {', '.join(DATASETS)}")
    rows = synthetic_rows(cfg)
    write_trace(args.output, rows)
    print(f"wrote {len(rows)} requests to {args.output}")
    return 0
