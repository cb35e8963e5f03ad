"""`sangam sweep`: simulate a grid of configurations at several rates; write one tidy table and plots."""

from __future__ import annotations

import argparse
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runs.config import RunConfig, RunFiles
from runs.options import add_options, collect, listed, nonempty_path, option

if TYPE_CHECKING:  # sim is imported when a command runs, not when the parser is built
    from sim.sweep import GridOptions, Point

FIXED = ("gpu", "gpus", "num_requests", "arrival_cv", "mask_len", "prefill_budget", "policy", "max_decodes",
         "pages", "kv_cache_dtype")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Where `sangam sweep` writes."""

    out: Path = option(Path("sweep"), "write sweep.csv (and .parquet), the plots and the cache here",
                       parse=nonempty_path, metavar="DIR")  # fmt: skip


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
    testbeds = {name: "the testbed's" for name in TESTBED_DEFAULTS if name != "gpu"}
    add_options(
        parser.add_argument_group("testbed"), SimOptions, defaults=TESTBED_DEFAULTS, default_text=testbeds
    )


def grid_points(
    args: argparse.Namespace, grid_options: GridOptions, rates: list[float], **fixed: Any
) -> list[Point]:
    """The points of `sangam sweep` and `sangam search` on the testbed the options name (`--testbed`,
    else `sangam-<gpu>`), resolved as `sangam sim` resolves a run; `fixed`: RunConfig values."""
    from cli.sim import given_options
    from cli.trace import check_trace_name, refuse_rate_of_timed_trace
    from profiles.testbeds import choose_testbed
    from sim.options import SimOptions, options_on_testbed
    from sim.sweep import grid

    for trace in grid_options.traces:
        check_trace_name(trace)
        refuse_rate_of_timed_trace(trace, getattr(args, "qps", None))  # search has no --qps
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
    from cli.bars import bar
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
    written = write_table(rows, options.out)
    plots = plot_latency(rows, options.out)
    written += plots.paths
    wall = time.perf_counter() - started
    print_table(rows)
    builds = ", ".join(sorted({str(r["build"]) for r in rows}))
    cached = f"{counts.cached} from the cache"
    print(f"{len(points)} points: {counts.ran} run, {cached} ({wall:.1f} s), {builds} build")
    for path in written:
        print(f"wrote {path}")
    if not any(p.suffix == ".parquet" for p in written):
        print("(no sweep.parquet: pyarrow is not installed)")
    for why in plots.skipped:
        print(f"({why})")
    return 0


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per configuration and rate (seeds averaged): the served rate, mean and p99 end-to-end
    latency, and whether every seed's run kept up with its arrivals (`sim.steady`); a run that did not
    reach a steady state is marked, since its latencies grow with the run's length."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    keys = ("model", "trace", "layout", "budget", "theta", "qps")
    varied = [k for k in ("model", "trace", "budget", "theta") if len({str(r[k]) for r in rows}) > 1]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    headers = {"model": "model", "trace": "trace", "budget": "tau", "theta": "theta"}
    table = Table(title="sangam sweep", box=box.SIMPLE_HEAD)
    for header in ("layout", *(headers[k] for k in varied), "QPS", "served", "mean s", "p99 s", "steady"):
        table.add_column(header, justify="right")
    unsteady = 0
    for key, members in groups.items():
        named = dict(zip(keys, key, strict=True))
        steady = [m.get("steady") for m in members]
        unsteady += sum(s is False for s in steady)
        mark = "-" if any(s is None for s in steady) else "yes" if all(steady) else "NO *"
        served = [m["served_qps"] for m in members if m.get("served_qps") is not None]
        cells = (
            named["layout"], *(Path(str(named[k])).name if k == "trace" else named[k] for k in varied),
            f"{named['qps']:g}", f"{sum(served) / len(served):.2f}" if served else "-",
            _seconds(members, "mean_e2el_ms"), _seconds(members, "p99_e2el_ms"), mark,
        )  # fmt: skip
        table.add_row(*map(str, cells))
    console = Console()
    console.print(table)
    if unsteady:
        console.print(
            f"* {unsteady} of {len(rows)} points did not reach a steady state: the number of requests in the "
            "system grew over the second half of the run (served below offered), so their latencies "
            "depend on the run's length (the steady column of sweep.csv)",
            soft_wrap=True,
        )


def _seconds(members: list[dict[str, Any]], key: str) -> str:
    values = [m[key] for m in members if m.get(key) is not None]
    return f"{sum(values) / len(values) / 1000:.2f}" if values else "-"
