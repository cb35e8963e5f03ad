"""The capacity search behind the explorer's search page (no Streamlit here): the highest QPS at which
each configuration of a grid meets SLOs, as `sangam search` finds it (`sim.search`), and its tables.

The page's form becomes a `CapacityQuery`; `run_query` builds the same grid as the command line
(`sim.sweep.grid`) and searches it on a local process pool of `app.sweep.WORKERS` processes."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import TypeVar

import pandas as pd

from app.inputs import MAX_POINTS, MAX_REQUESTS, InputError
from app.sweep import WORKERS
from runs.config import DATASETS, RunConfig
from runs.tally import Watcher
from sim.engines import LocalPool
from sim.options import SimOptions
from sim.search import MAX_STEPS, Answer, SearchOptions, Slo, granularity, parse_slo, search
from sim.sweep import Cache, GridOptions, expand_layouts, grid, int_list, seed_list

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CapacityQuery:
    """What the search page asks: a grid (as `sangam search`'s options, lists as text) and SLOs."""

    model: str = "llada-8b"
    trace: str = "sharegpt"
    gpu: str = "h100"
    gpus: int = 8
    layouts: str = "all"
    budgets: str = "1024"
    thetas: str = "8192"
    slos: str = "p99_e2el_s=20"
    granularity: float | None = None  # one the runs resolve, as `sangam search`
    start_qps: float | None = None  # 1 per GPU of each configuration, as `sangam search`
    max_qps: float = 64.0
    num_requests: int = 1000
    seeds: str = "0"
    cost: str = "profile"


@dataclass(frozen=True, slots=True)
class Capacity:
    """A finished search: the query, its SLOs, the answers (best first) and their precision, QPS."""

    query: CapacityQuery
    slos: tuple[Slo, ...]
    answers: tuple[Answer, ...]
    granularity: float


def parse_query(query: CapacityQuery) -> tuple[list[Slo], GridOptions, SearchOptions]:
    """The query's SLOs, grid and search options; InputError naming the field that is wrong."""
    if query.trace not in DATASETS:
        raise InputError(f"the search needs a synthetic trace ({', '.join(DATASETS)}), not {query.trace!r}")
    if query.gpus < 1:
        raise InputError("GPUs: at least 1")
    slos = [_field("SLO", parse_slo, part) for part in _items(query.slos)]
    if not slos:
        raise InputError("SLO: give at least one METRIC=LIMIT, for example p99_e2el_s=20")
    layouts = tuple(_items(query.layouts))
    try:
        layout_count = len(expand_layouts(layouts, query.gpus))
    except ValueError as err:
        raise InputError(f"layouts: {err}") from None
    # values apart by commas, semicolons or spaces, as in the layouts (spaces once ran two values into one)
    budgets = _field("τ", int_list, ",".join(_items(query.budgets)))
    thetas = _field("θ", int_list, ",".join(_items(query.thetas)))
    seeds = _field("seeds", seed_list, ",".join(_items(query.seeds)))
    if not (layouts and budgets and thetas and seeds):
        raise InputError("layouts, τ, θ and seeds each need at least one value")
    points = layout_count * len(budgets) * len(thetas) * len(seeds)  # a round of probes runs them all
    layouts_text, seeds_text = _count(layout_count, "layout"), _count(len(seeds), "seed")
    grid_text = f"{layouts_text} x {len(budgets)} τ x {len(thetas)} θ x {seeds_text}"
    if points > MAX_POINTS:
        raise InputError(
            f"{grid_text} is {points} runs a probe, too many for one search (at most {MAX_POINTS})"
        )
    if points * query.num_requests > MAX_REQUESTS:
        raise InputError(
            f"{grid_text} of {query.num_requests:,} requests is too many for one probe (at most "
            f"{MAX_REQUESTS:,} requests in all): fewer configurations, seeds or requests per probe"
        )
    rates = [r for r in (query.granularity, query.start_qps) if r is not None] + [query.max_qps]
    if not (rates[0] > 0 and rates == sorted(rates)):
        raise InputError("need 0 < precision <= start QPS <= max QPS")
    options = GridOptions(
        models=(query.model,), traces=(query.trace,), layouts=layouts, budgets=tuple(budgets),
        thetas=tuple(thetas), seeds=tuple(seeds),
    )  # fmt: skip
    search_options = SearchOptions(
        slo=tuple(slos), granularity=query.granularity, start_qps=query.start_qps, max_qps=query.max_qps
    )
    return slos, options, search_options


def run_query(query: CapacityQuery, watch: Watcher | None = None) -> Capacity:
    """Search every configuration of the query's grid on WORKERS processes; `watch` hears the points."""
    slos, options, search_options = parse_query(query)
    base = RunConfig(gpu=query.gpu, gpus=query.gpus, num_requests=query.num_requests)
    one_seed = dataclasses.replace(options, seeds=options.seeds[:1])
    configs = grid(base, one_seed, [1.0], SimOptions(cost=query.cost), None)  # each probe sets its rate
    step = granularity(search_options, configs)
    if not query.max_qps / step <= MAX_STEPS:  # as `sim.search.search` refuses it, in the page's words
        raise InputError(
            f"max QPS {query.max_qps:g} is over {MAX_STEPS:g} steps of the precision {step:g}: raise the "
            "precision or lower max QPS"
        )
    search_options = dataclasses.replace(search_options, granularity=step)
    with closing(LocalPool(WORKERS)) as engine:
        answers = search(configs, slos, options.seeds, engine, Cache(None), search_options, watch=watch)
    return Capacity(query, tuple(slos), tuple(answers), step)


def ranking_frame(capacity: Capacity) -> pd.DataFrame:
    """One row per configuration, best first: the columns of `sangam search`'s search.csv."""
    rows = []
    for rank, answer in enumerate(capacity.answers, 1):
        cfg = answer.point.config
        rows.append({
            "rank": rank, "layout": cfg.layout.name, "budget": cfg.budget, "theta": cfg.theta,
            "max_qps_under_slo": answer.max_qps, "capped": answer.capped,
            "probes": answer.marks(),
        })  # fmt: skip
    return pd.DataFrame(rows)


def probes_frame(capacity: Capacity) -> pd.DataFrame:
    """Every probe: its configuration, rate, whether it met every SLO (and kept up), its mark as
    `sangam search` prints it (`sim.search.MARKS`), and each SLO's value (the mean over the seeds, in
    the SLO's unit)."""
    rows = []
    for answer in capacity.answers:
        label = config_label(answer)
        for (qps, met, values), mark in zip(answer.probes, answer.probe_marks(), strict=True):
            row = {"configuration": label, "qps": qps, "met": met, "mark": mark}
            for slo in capacity.slos:
                row[slo.text] = values[slo.text] * _unit(slo)
            rows.append(row)
    return pd.DataFrame(rows).sort_values(["configuration", "qps"], ignore_index=True)


def config_label(answer: Answer) -> str:
    cfg = answer.point.config
    return f"{cfg.layout.name} τ{cfg.budget} θ{cfg.theta}"


def slo_limit(slo: Slo) -> float:
    """The limit in the unit the user wrote (seconds for `_s` SLOs)."""
    return slo.limit * _unit(slo)


def _unit(slo: Slo) -> float:
    """From the summary's unit to the SLO's own (ms to s for an `_s` SLO)."""
    name = slo.text.partition("=")[0].partition("<")[0].strip()
    return 1 / 1000 if name.endswith("_s") else 1.0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _items(text: str) -> list[str]:
    """`a, b c;d` -> [a, b, c, d]."""
    return text.replace(";", " ").replace(",", " ").split()


def _field(name: str, parse: Callable[[str], T], text: str) -> T:
    try:
        return parse(text)
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise InputError(f"{name}: {err}") from None
