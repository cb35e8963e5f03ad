"""`sangam search`: the highest QPS at which each configuration of a grid meets an SLO, ranked."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from contextlib import closing
from pathlib import Path
from typing import Any

from cli.sweep import add_grid, grid_points
from runs.build import build
from runs.options import add_options, collect

COLUMNS = (
    "rank",
    "model",
    "trace",
    "layout",
    "budget",
    "theta",
    "testbed",
    "time_scale",
    "max_qps_under_slo",
    "capped",
    "resolution_qps",
    "requests_needed",
    "probes",
    "slo",
    "build",
)


def add_parser(commands: Any, name: str) -> None:
    from sim.search import SearchOptions

    parser = commands.add_parser(
        name, help="the highest QPS at which each configuration meets an SLO (bracketing and bisection)"
    )
    add_grid(parser)
    add_options(parser, SearchOptions)


def run(args: argparse.Namespace) -> int:
    from cli.bars import bar
    from sim.engines import EngineOptions, runner
    from sim.search import SearchOptions, granularity, search
    from sim.sweep import Cache, Counts, GridOptions

    if args.slo is None:
        raise ValueError("give at least one --slo METRIC=LIMIT, for example --slo p99_e2el_s=20")
    options = collect(SearchOptions, args)
    grid_options = collect(GridOptions, args)
    one_seed = dataclasses.replace(grid_options, seeds=grid_options.seeds[:1])
    configs = grid_points(args, one_seed, [1.0], qps=1.0)  # each probe sets its own rate
    for point in configs:
        if not point.config.is_synthetic:
            raise ValueError(
                f"--trace {point.config.trace}: search needs a synthetic trace (sharegpt, arxiv)"
            )
    options = dataclasses.replace(options, granularity=granularity(options, configs))
    counts = Counts()
    with closing(runner(collect(EngineOptions, args))) as engine, bar("search", "points") as watch:
        answers = search(configs, options.slo, grid_options.seeds, engine, Cache(grid_options.cache),
                         options, counts, watch)  # fmt: skip
    rows = [row(rank, a, options) for rank, a in enumerate(answers, 1)]
    print_table(rows, options)  # first: a path that cannot be written loses nothing printed
    out = write(rows, options.out)
    print(f"{counts.ran} points run, {counts.cached} from the cache, {build()} build; wrote {out}")
    return 0


def row(rank: int, answer: Any, options: Any) -> dict[str, Any]:
    """`resolution_qps`: how far above the capacity the answer can be (the steadiness test's resolution
    at it, empty if untested); `requests_needed`: empty where that is within the granularity, else about
    how many requests per run would make it so."""
    cfg = answer.point.config
    test = answer.steadiness
    return {
        "rank": rank, "model": cfg.model, "trace": cfg.trace, "layout": cfg.layout.name, "budget": cfg.budget,
        "theta": cfg.theta, "testbed": answer.point.sim.testbed, "time_scale": answer.point.sim.time_scale,
        "max_qps_under_slo": answer.max_qps, "capped": answer.capped,
        "resolution_qps": None if test is None else float(f"{test.resolution_qps:.3g}"),
        "requests_needed": answer.too_short(options.granularity), "probes": answer.marks(),
        "slo": " ".join(s.text for s in options.slo), "build": build(),
    }  # fmt: skip


def write(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write the ranking to `path` (.csv or .json; anything else is a directory, given search.csv),
    making its directories; the file written."""
    if path.suffix not in (".csv", ".json"):
        path = path / "search.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=2) + "\n")
        return path
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def print_table(rows: list[dict[str, Any]], options: Any) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from sim.search import legend

    slo = ", ".join(s.text for s in options.slo)
    first = rows[0]
    scale = f", times {first['time_scale']:g}" if first["time_scale"] != 1.0 else ""
    title = f"sangam search: max QPS under {slo} on testbed {first['testbed']}{scale}"
    caption = f"+-: how far above the capacity max QPS can be; probes: {legend()}"
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD)
    for header in ("#", "layout", "model", "trace", "tau", "theta", "max QPS", "+-", "probes"):
        table.add_column(header, justify="left" if header.startswith("probes") else "right")
    for r in rows:
        best = f"{'>=' if r['capped'] else ''}{r['max_qps_under_slo']:g}"
        spread = "" if r["resolution_qps"] is None else f"{r['resolution_qps']:.2g}"
        cells = (r["rank"], r["layout"], r["model"], Path(r["trace"]).name, r["budget"], r["theta"], best,
                 spread)  # fmt: skip
        table.add_row(*map(str, cells), r["probes"])
    console = Console()
    console.print(table)
    best_row = first
    console.print(
        f"best: {best_row['layout']} (tau {best_row['budget']}, theta {best_row['theta']}) at "
        f"{best_row['max_qps_under_slo']:g} QPS",
        soft_wrap=True,
    )
    short = [r for r in rows if r["requests_needed"] is not None]
    if short:
        console.print(too_short_note(short, options), soft_wrap=True)


def too_short_note(rows: list[dict[str, Any]], options: Any) -> str:
    """What the runs could not tell: `+-` is how far above the capacity each answer can be (a backlog
    growing more slowly goes unseen), and how many requests per run would resolve the granularity."""
    worst = max(rows, key=lambda r: r["requests_needed"])
    names = ", ".join(r["layout"] for r in rows[:4]) + (f" and {len(rows) - 4} more" if len(rows) > 4 else "")
    g = options.granularity
    return (
        f"too short to tell: at {names} the runs cannot tell whether the answer keeps up to within the "
        f"granularity {g:g} QPS (a backlog growing by less than the +- column, requests/s, goes unseen); "
        f"about {worst['requests_needed']:,} requests (-n) would tell, or use --granularity "
        f"{max(r['resolution_qps'] for r in rows):.2g}"
    )
