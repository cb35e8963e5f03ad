"""Sweeps over the simulator: a grid of configurations, one cached point per (config, rate, seed).

A point is one resolved `RunConfig` (layout, budget, theta, rate, seed; the testbed's GPU, KV pages and
arrival clip made explicit) plus the testbed it models and the options that price it (`SimOptions`: the
testbed's name, link and control delay, `--time-scale`) and the progress model spec (the testbed's unless
given). Its cache key is a hash of all of that, the testbed's content included, and of the code that
computes it (`code_version`: the sources of sangam/, sim/ and profiles/, profile data and shipped
testbeds included), so a repeated or interrupted sweep runs only the points it lacks. Points run on an
engine (`sim.engines`: a local process pool, or Ray); a point's result depends only on its key, so the
tidy table is the same whatever runs it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiles.testbed import Testbed, testbed_dict
from profiles.testbeds import choose_testbed
from runs.args import positive_int
from runs.build import MANIFEST
from runs.config import RunConfig, load_progress, workload_points
from runs.options import nonempty_path, option
from runs.tally import Tally, Watcher
from sangam.hardware import MODELS
from sangam.layout import Kind, parse_mode
from sim.early_stop import Exceeds
from sim.options import SimOptions
from sim.setup import Resolver
from sim.steady import KEYS as STEADY_KEYS
from sim.steady import steadiness

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("sangam", "runs", "sim", "profiles")  # what a point's numbers (and its summary's keys) depend on
FIRST_COLUMNS = ("model", "trace", "layout", "budget", "theta", "qps", "seed")  # the grid, then the rest
HIDDEN = ("qps", "sim_control_ms")  # qps is listed first; the summary's `control_ms` is the control delay
NOT_METRICS = ("config", "kv_link", "cost_model", "sim_wall_s", "build")  # wall time differs run to run
TAGS = {"budget": "tau", "theta": "theta"}  # how a legend heads a varied grid column
LEGEND_ROWS = 24  # legend entries in one column beside a row of panels


def layout_list(text: str) -> list[str]:
    """`colocated`, `all`, `5P3C` or several of them, comma-separated."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name.lower() != "all":
            parse_mode(name)
    return names


def int_list(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",") if part]


def seed_list(text: str) -> list[int]:
    seeds = []
    for part in (part for part in text.split(",") if part):
        try:
            seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds are whole numbers, got {part!r}") from None
    return seeds


@dataclass(frozen=True, slots=True)
class GridOptions:
    """The grid of `sangam sweep` and `sangam search`: every combination of these is a configuration."""

    models: tuple[str, ...] = option(
        "llada-8b", "modelled models", aliases=("--model",), many=True, choices=MODELS
    )
    traces: tuple[str, ...] = option(
        "sharegpt", "traces: sharegpt, arxiv or .csv/.jsonl files", aliases=("--trace",), many=True
    )
    layouts: tuple[str, ...] = option(
        "colocated", "layouts (as --mode), or all: every <n>P<m>D and <n>P<m>C split of --gpus, colocated",
        parse=layout_list, aliases=("--mode", "--modes"), many=True,
    )  # fmt: skip
    budgets: tuple[int, ...] = option(
        1024, "tau of colocated and decode-role workers", parse=int_list, aliases=("--budget",), many=True
    )
    thetas: tuple[int, ...] = option(
        8192, "hybrid overflow thresholds", parse=int_list, aliases=("--theta",), many=True
    )
    seeds: tuple[int, ...] = option(0, "seeds; every point runs once per seed", parse=seed_list,
                                    aliases=("--seed",), many=True)  # fmt: skip
    cache: Path | None = option(
        None, "keep one result per point here, keyed by its resolved configuration and the code version",
        parse=nonempty_path, metavar="DIR",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for f in ("models", "traces", "layouts", "budgets", "thetas", "seeds"):  # a bare default: one value
            value = getattr(self, f)
            if not isinstance(value, tuple):
                object.__setattr__(self, f, (value,))


def expand_layouts(names: Iterable[str], gpus: int) -> list[str]:
    """Canonical layout names, `all` expanded (colocated, then every split of `gpus`), each once."""
    out: list[str] = []
    for name in names:
        if name.lower() == "all":
            splits = [f"{n}P{gpus - n}{kind}" for kind in "DC" for n in range(1, gpus)]
            expanded = [parse_mode("colocated", gpus).name, *splits]
        else:
            expanded = [parse_mode(name, gpus).name]
        out += [layout for layout in expanded if layout not in out]
    return out


@dataclass(frozen=True, slots=True)
class Point:
    """One simulation: a resolved config, how it is priced, its progress model spec, and the testbed whose
    profiles price it (None: `sangam-<gpu>`'s, as `sangam sim` without `--testbed`)."""

    config: RunConfig
    sim: SimOptions
    progress: str | None = None
    testbed: Testbed | None = None
    stop: tuple[Exceeds, ...] = ()  # a search's probe: stop once a limit is certain to be exceeded

    def resolved(self) -> dict[str, Any]:
        """Every input of the point, defaults made explicit (JSON-ready)."""
        cfg = self.config.resolved()
        cfg["policy"] = str(self.config.policy.value)
        if not self.config.is_synthetic:
            cfg["trace_sha256"] = file_digest(Path(self.config.trace))
        sim = dataclasses.asdict(self.sim)
        out = {**cfg, **{f"sim_{k}": v for k, v in sim.items()}, "progress": self.progress}
        if self.stop:
            out["stop"] = [f"{rule.key}>{rule.limit_ms!r}" for rule in self.stop]
        return out

    def key(self, code: str) -> str:
        testbed = testbed_dict(self.testbed) if self.testbed is not None else None
        text = json.dumps({"point": self.resolved(), "testbed": testbed, "code": code}, sort_keys=True,
                          default=str)  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def grid(
    base: RunConfig,
    options: GridOptions,
    rates: Sequence[float],
    sim: SimOptions,
    progress: str | None,
    testbed: Testbed | None = None,
) -> list[Point]:
    """Every combination of the grid at every rate and seed on `testbed` (None: `sangam-<base.gpu>`), as
    `sangam sim` resolves a run: the testbed's GPU, KV pages (else its profile's live worker's), arrival
    clip and forwards per block, except where `base` (pages, arrival_clip, arrival_cv) or `progress`
    give their own. `sim`: the options as `sim.options.options_on_testbed` resolved them."""

    testbed = testbed or choose_testbed(None, base.gpu)
    sim = dataclasses.replace(sim, testbed=testbed.name)
    given: Mapping[str, Any] = {
        "pages": base.pages, "arrival_clip": base.arrival_clip, "arrival_cv": base.arrival_cv
    }  # fmt: skip
    resolver = Resolver(testbed, {"cost": sim.cost})
    points = []
    for model, trace, budget, theta in itertools.product(
        options.models, options.traces, options.budgets, options.thetas
    ):
        for layout in expand_layouts(options.layouts, base.gpus):
            for qps, seed in itertools.product(rates, options.seeds):
                cfg = dataclasses.replace(
                    base, model=model, trace=trace, mode=layout, gpus=parse_mode(layout).num_workers,
                    budget=budget, theta=theta, qps=qps, seed=seed,
                )  # fmt: skip
                setup = resolver.resolve(cfg, given, progress)
                points.append(Point(setup.config, sim, setup.progress, testbed))
    return points


_resolvers: dict[tuple[str, str, float], Resolver] = {}  # per process: each profile is read once


def _resolver(testbed: Testbed, sim: SimOptions) -> Resolver:
    """The resolver of the points on `testbed` priced as `sim` says (its cost model and time scale)."""
    key = (json.dumps(testbed_dict(testbed), sort_keys=True), sim.cost, sim.time_scale)
    if key not in _resolvers:
        _resolvers[key] = Resolver(testbed, {"cost": sim.cost, "time_scale": sim.time_scale})
    return _resolvers[key]


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one point in this process; its summary (as `sangam sim` writes it) with whether it
    kept up with its arrivals (`sim.steady`; None for a run stopped early, with a request lost or too
    few requests)."""
    from sim.run import simulate

    cfg = point.config
    testbed = point.testbed or choose_testbed(None, cfg.gpu)
    cost, cost_name, _ = _resolver(testbed, point.sim).priced(cfg.model)
    ((cfg, rows),) = workload_points(cfg, [cfg.qps])
    result = simulate(
        cfg,
        rows,
        cost,
        progress=load_progress(point.progress),
        link=point.sim.link_spec(),
        control_s=point.sim.control_ms / 1000,
        failures=point.sim.failures(),
        restart_after_s=point.sim.restart_after,
        stop=point.stop,
    )
    summary = result.summary
    summary.update(cost_model=cost_name, kv_link=point.sim.kv_link(), control_ms=point.sim.control_ms)
    test = None
    if "stopped_at_s" not in summary and not any(req.error for req in result.requests):
        test = steadiness(
            [req.arrival for req in result.requests],
            [end for req in result.requests if (end := req.blocks[-1].end) is not None and req.finished],
        )
    summary.update(test.summary() if test is not None else dict.fromkeys(STEADY_KEYS))
    return summary


@functools.cache
def code_version(root: Path = ROOT) -> str:
    """A hash of the sources (and profile data) a point's result depends on; no git needed."""
    digest = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and not _built(path):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _built(path: Path) -> bool:
    """Made from the sources by Python or by a native build (runs/build.py), which can differ
    between machines with the same sources."""
    return path.suffix in (".pyc", ".so") or path.name == MANIFEST.name


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Cache:
    """One JSON file per point, `<key>.json`, written atomically when the point finishes."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            return None
        path = self.root / f"{key}.json"
        try:
            summary: dict[str, Any] = json.loads(path.read_text())["summary"]
        except (OSError, ValueError, KeyError):
            return None  # absent, or cut short by an interruption: run it again
        return summary

    def put(self, key: str, point: Point, summary: dict[str, Any]) -> None:
        if self.root is None:
            return
        path = self.root / f"{key}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"point": point.resolved(), "summary": summary}, default=str) + "\n")
        os.replace(tmp, path)


@dataclass(slots=True)
class Counts:
    """How many points a call ran and how many it found in the cache."""

    ran: int = 0
    cached: int = 0


Runner = Callable[[Sequence[Point]], Iterator[tuple[int, dict[str, Any]]]]  # an engine: sim.engines


def evaluate(
    points: Sequence[Point],
    runner: Runner,
    cache: Cache,
    counts: Counts | None = None,
    watch: Watcher | None = None,
) -> list[dict[str, Any]]:
    """Every point's summary, from the cache or run (and cached as soon as it finishes), in order;
    `watch` hears the points done (those from the cache first) of all of them as each finishes.
    A point with a stop rule takes the whole run's result where there is one, and one that ran to the
    end is cached as the whole run."""
    code = code_version()
    keys = [p.key(code) for p in points]
    summaries: list[dict[str, Any] | None] = [cache.get(k) for k in keys]
    for i, point in enumerate(points):
        if summaries[i] is None and point.stop:
            summaries[i] = cache.get(_whole(point).key(code))
    missing = [i for i, s in enumerate(summaries) if s is None]
    if counts is not None:
        counts.cached += len(points) - len(missing)
        counts.ran += len(missing)
    done = len(points) - len(missing)
    if watch is not None:
        watch(Tally(done, len(points)))
    for j, summary in runner([points[i] for i in missing]):
        i = missing[j]
        if points[i].stop and "stopped_at_s" not in summary:
            cache.put(_whole(points[i]).key(code), _whole(points[i]), summary)
        else:
            cache.put(keys[i], points[i], summary)
        summaries[i] = summary
        done += 1
        if watch is not None:
            watch(Tally(done, len(points)))
    return [s for s in summaries if s is not None]


def _whole(point: Point) -> Point:
    return dataclasses.replace(point, stop=())


def tidy_rows(points: Sequence[Point], summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point: its resolved configuration, then the summary's metrics; sorted by the
    configuration so the table does not depend on the order the points finished in."""
    rows = []
    for point, summary in zip(points, summaries, strict=True):
        resolved = point.resolved()
        config = {c: resolved[c] for c in FIRST_COLUMNS}
        config.update((k, v) for k, v in resolved.items() if k not in config and k not in HIDDEN)
        config["cost_model"] = summary.get("cost_model")
        config["build"] = summary.get("build")
        metrics = {k: v for k, v in summary.items() if k not in NOT_METRICS and _scalar(v)}
        rows.append({**config, **metrics})
    return sorted(rows, key=lambda r: tuple(_order(r[c]) for c in (*FIRST_COLUMNS, *r)))


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _order(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every key of the rows, in first-seen order."""
    return list(dict.fromkeys(k for r in rows for k in r))


def write_table(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """`sweep.csv` (always) and `sweep.parquet` (when pyarrow is importable) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    names = columns(rows)
    path = out / "sweep.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(names)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else _cell(row[c]) for c in names])
    written = [path]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    table = pa.Table.from_pylist([{c: row.get(c) for c in names} for row in rows])
    pq.write_table(table, out / "sweep.parquet")
    return [*written, out / "sweep.parquet"]


def _cell(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True, slots=True)
class Plots:
    """The figures a sweep drew, and one line for each it could not draw."""

    paths: list[Path]
    skipped: list[str]


def plot_latency(rows: Sequence[dict[str, Any]], out: Path) -> Plots:
    """Per (model, trace), `latency-<model>-<trace>.png` and `.pdf`: mean and p99 end-to-end latency (s,
    averaged over seeds) against QPS, a line per layout (and budget and theta where the sweep varies
    them), a row of panels per layout kind with its legend beside it. Each column's latency axis is
    shared by its rows and ends where saturated layouts would flatten the rest
    (`runs.plotting.cap_latency`). None without matplotlib, or with more lines than one figure can
    style apart."""
    try:
        from runs.plotting import DISTINCT, house_style
    except ImportError:
        return Plots([], ["no figures: matplotlib is not installed"])
    varied = [c for c in ("budget", "theta") if len({r[c] for r in rows}) > 1]
    plots = Plots([], [])
    with house_style():
        for (model, trace), group in _groups(rows, ("model", "trace")).items():
            title = f"{model} on {Path(str(trace)).name}"
            if (lines := len(_groups(group, ("layout", *varied)))) > DISTINCT:
                plots.skipped.append(f"no figure of {title}: {lines} lines, more than {DISTINCT} styles")
                continue
            stem = out / f"latency-{model}-{_slug(str(trace))}"
            plots.paths.extend(_latency_figure(group, varied, title, stem))
    return plots


def _latency_figure(
    rows: Sequence[dict[str, Any]], varied: Sequence[str], title: str, stem: Path
) -> list[Path]:
    from runs.plotting import cap_latency, figure, legend_handles, legend_inches, line, save, styled

    lines = _groups(rows, ("layout", *varied))
    by_kind: dict[Kind, list[tuple[Any, ...]]] = {}
    for key in lines:
        by_kind.setdefault(parse_mode(key[0]).kind, []).append(key)
    kinds = [kind for kind in Kind if kind in by_kind]
    label = {key: ", ".join(map(str, key)) for key in lines}
    style_of = styled(label[key] for kind in kinds for key in by_kind[kind])
    tall = max(len(keys) for keys in by_kind.values())
    columns = math.ceil(tall / LEGEND_ROWS)
    row_height = max(2.5, 0.6 + 0.19 * math.ceil(tall / columns))  # a row is as tall as its legend
    fig = figure(7.0 + columns * legend_inches(list(label.values())), 0.4 + row_height * len(kinds))
    axes = fig.subplots(len(kinds), 2, sharex=True, squeeze=False)
    for row, kind in zip(axes, kinds, strict=True):
        for key in by_kind[kind]:
            by_rate = _groups(lines[key], ("qps",))
            rates = sorted(q for (q,) in by_rate)
            for ax, stat in zip(row, ("mean", "p99"), strict=True):
                # a point where no request completed has no latency: a gap in its line
                key_ms = f"{stat}_e2el_ms"
                values = [_mean(r.get(key_ms, math.nan) for r in by_rate[(q,)]) / 1000 for q in rates]
                line(ax, rates, values, style_of[label[key]], label[key])
                ax.set_title(f"{kind}: {stat}")
        row[0].set_ylabel("end-to-end latency (s)")
    capped = [ax for column in axes.T for ax in cap_latency(list(column))]
    heading = ", ".join(["layout", *(TAGS[c] for c in varied)])
    for row, kind in zip(axes, kinds, strict=True):
        mine = {label[key]: style_of[label[key]] for key in by_kind[kind]}
        handles, labels = legend_handles(mine, beyond=any(ax in capped for ax in row))
        row[1].legend(handles, labels, title=heading, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      frameon=False, ncols=columns, alignment="left")  # fmt: skip
    for ax in axes[-1]:
        ax.set_xlabel("QPS (requests/s)")
    fig.suptitle(title)
    return save(fig, stem)


def _groups(
    rows: Iterable[dict[str, Any]], keys: Sequence[str]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append(row)
    return out


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else math.nan


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(text).stem)
