"""`sangam sweep`: simulate a grid of configurations at several rates; write one tidy table and plots."""

from __future__ import annotations

import argparse
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runs.config import RunConfig, RunFiles
from runs.options import add_options, collect, listed, option

if TYPE_CHECKING:  # sim is imported when a command runs, not when the parser is built
    from sim.sweep import GridOptions, Point

FIXED = ("gpu", "gpus", "num_requests", "arrival_cv", "mask_len", "prefill_budget", "policy", "max_decodes",
         "pages")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Where `sangam sweep` writes."""

    out: Path = option(Path("sweep"), "write sweep.csv (and .parquet), the plots and the cache here",
                       parse=Path, metavar="DIR")  # fmt: skip


def add_grid(parser: argparse.ArgumentParser) -> None:
    """The options `sangam sweep` and `sangam search` share: the grid, the fixed config, the testbed (as
    `sangam sim` takes them: a flag given explicitly overrides the testbed's value)."""
    from cli.sim import TESTBED_DEFAULTS
    from sim.engines import EngineOptions
    from sim.options import SimOptions
    from sim.sweep import GridOptions

    add_options(parser, GridOptions)
    add_options(parser.add_argument_group("engine"), EngineOptions)
    add_options(parser, RunConfig, only=FIXED, defaults={"gpu": None}, default_text={"gpu": "the testbed's"})
    per_pair = {"progress": "the testbed's per model and trace"}
    add_options(parser, RunFiles, only=("progress",), default_text=per_pair)
    testbeds = {name: "the testbed's" for name in ("control_ms", "link_gbps", "link_latency_ms")}
    add_options(
        parser.add_argument_group("testbed"), SimOptions, defaults=TESTBED_DEFAULTS, default_text=testbeds
    )


def grid_points(
    args: argparse.Namespace, grid_options: GridOptions, rates: list[float], **fixed: Any
) -> list[Point]:
    """The points of `sangam sweep` and `sangam search` on the testbed the options name (`--testbed`,
    else `sangam-<gpu>`), resolved as `sangam sim` resolves a run; `fixed`: RunConfig values."""
    from cli.sim import given_options
    from profiles.testbeds import choose_testbed
    from sim.options import SimOptions, options_on_testbed
    from sim.sweep import grid

    testbed = choose_testbed(args.testbed, args.gpu)
    base = collect(RunConfig, args, gpu=testbed.gpu, **fixed)
    options = options_on_testbed(testbed, given_options(args, SimOptions))
    return grid(base, grid_options, rates, options, collect(RunFiles, args).progress, testbed)


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
    from sim.sweep import Cache, Counts, GridOptions, evaluate, plot_latency, tidy_rows, write_table

    options = collect(SweepOptions, args)
    grid_options = collect(GridOptions, args)
    rates = list(listed(args, "qps", RunConfig().qps))
    points = grid_points(args, grid_options, rates, qps=RunConfig().qps)
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
