"""`sangam sweep`: simulate a grid of configurations at several rates; write one tidy table and plots."""

from __future__ import annotations

import argparse
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sangam.config import RunConfig, RunFiles
from sangam.options import add_options, collect, listed, option

FIXED = ("gpu", "gpus", "num_requests", "arrival_cv", "mask_len", "prefill_budget", "policy", "max_decodes",
         "pages")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Where `sangam sweep` writes."""

    out: Path = option(Path("sweep"), "write sweep.csv (and .parquet), the plots and the cache here",
                       parse=Path, metavar="DIR")  # fmt: skip


def add_grid(parser: argparse.ArgumentParser) -> None:
    """The options `sangam sweep` and `sangam search` share: the grid, the fixed config, the testbed."""
    from sim.engines import EngineOptions
    from sim.options import SimOptions
    from sim.sweep import GridOptions

    add_options(parser, GridOptions)
    add_options(parser.add_argument_group("engine"), EngineOptions)
    add_options(parser, RunConfig, only=FIXED)
    add_options(parser, RunFiles, only=("progress",))
    add_options(parser.add_argument_group("testbed"), SimOptions, skip=("testbed", "time_scale"))  # sim only


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="simulate a grid (models, traces, layouts, budgets, theta, rates, seeds) into one table"
    )
    add_grid(parser)
    add_options(parser, RunConfig, only=("qps",))
    add_options(parser, SweepOptions)


def run(args: argparse.Namespace) -> int:
    from cli.progress import bar
    from sim.engines import EngineOptions, runner
    from sim.options import SimOptions
    from sim.sweep import Cache, Counts, GridOptions, evaluate, grid, plot_latency, tidy_rows, write_table

    options = collect(SweepOptions, args)
    grid_options = collect(GridOptions, args)
    base = collect(RunConfig, args, qps=RunConfig().qps)
    points = grid(base, grid_options, listed(args, "qps", base.qps), collect(SimOptions, args),
                  collect(RunFiles, args).progress)  # fmt: skip
    cache = Cache(grid_options.cache or options.out / "cache")
    counts = Counts()
    started = time.perf_counter()
    with closing(runner(collect(EngineOptions, args))) as engine, bar("sweep", "points") as watch:
        summaries = evaluate(points, engine, cache, counts, watch)
    rows = tidy_rows(points, summaries)
    written = write_table(rows, options.out) + plot_latency(rows, options.out)
    wall = time.perf_counter() - started
    print(f"{len(points)} points: {counts.ran} run, {counts.cached} from the cache ({wall:.1f} s)")
    for path in written:
        print(f"wrote {path}")
    if not any(p.suffix == ".parquet" for p in written):
        print("(no sweep.parquet: pyarrow is not installed)")
    return 0
