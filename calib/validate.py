"""`sangam validate`: the same trace live on the GPU and in the simulator, and their differences.

The loads are placed relative to the simulated knee: the lowest swept QPS at which the simulated
mean end-to-end latency exceeds twice its value at the lowest rate; the three loads are 30%, 60%
and 90% of it unless given. Both sides run the config resolved once on the testbed
(`sim.setup.Resolver`) and share the seed, hence the lengths, arrivals and every block's forwards (the
live workers force the schedule of the testbed's progress model), and the KV pages (the sim takes the
live run's). Disaggregated and hybrid layouts also compare each pool's queueing and the KV transfer
time; `--link` gives the simulator a measured link profile.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from profiles.testbeds import choose_testbed
from runs.config import RunConfig, RunFiles, synthetic_rows
from runs.live_summary import check_measured, finite_number, run_summary
from runs.options import nonempty_path, option
from sim.points import run_points
from sim.run import SimResult
from sim.setup import Resolver, Setup

COMPARED = (
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "mean_queue_ms",
    "p99_queue_ms",
    "mean_decode_ms",
    # disaggregated and hybrid layouts: the queue of each pool and the KV transfer (zero, so left out, else)
    "mean_prefill_queue_ms",
    "mean_decode_queue_ms",
    "mean_transfer_ms",
    "p99_transfer_ms",
)
SWEEP = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)  # QPS per worker
SHARES = (("low", 0.3), ("medium", 0.6), ("near knee", 0.9))


def knee(setup: Setup) -> float:
    """The lowest swept QPS whose simulated mean e2e latency is over twice the lowest rate's."""
    workers = setup.config.layout.num_workers
    first = None
    for per_worker in SWEEP:
        mean = simulated(setup, per_worker * workers).summary["mean_e2el_ms"]
        first = first or mean
        if mean > 2 * first:
            return per_worker * workers
    return SWEEP[-1] * workers


def simulated(
    setup: Setup,
    qps: float,
    pages: int | None = None,
    out: Path | None = None,
    kv_cache_dtype: str | None = None,
) -> SimResult:
    """The setup's run at `qps` in the simulator, on `pages` KV pages of `kv_cache_dtype` if given (a live
    run's), its results in `out`."""
    cfg = dataclasses.replace(
        setup.config,
        qps=qps,
        pages=setup.config.pages if pages is None else pages,
        kv_cache_dtype=kv_cache_dtype or setup.config.kv_cache_dtype,
    )
    files = RunFiles(out=out, progress=setup.progress)
    (result,) = run_points([(cfg, synthetic_rows(cfg))], setup.cost, setup.cost_name, setup.options, files)
    return result


def compare(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, float]:
    """Signed error of the simulator against the live run, in percent, per compared metric.

    Metrics under 10 ms live are left out: zero transfers, and a colocated request's decode queue (about
    2 ms live, the pauses between each block's prefill and its first decode; none simulated).
    """
    return {key: 100 * (sim[key] - live[key]) / live[key] for key in COMPARED if live.get(key, 0) >= 10.0}


@dataclass(frozen=True, slots=True)
class ValidateOptions:
    """Where `sangam validate` runs, reads and reports."""

    out: Path = option(Path("results/validate"), "run directories (live-qpsQ/, sim-qpsQ/)",
                       parse=nonempty_path, metavar="DIR")  # fmt: skip
    live_results: Path | None = option(
        None, "compare with the live runs already in this directory (live-qpsQ/) instead of running them",
        parse=nonempty_path, metavar="DIR",
    )  # fmt: skip
    report: Path | None = option(
        None, "report JSON", parse=nonempty_path, metavar="FILE",
        default_text="benchmarks/results/validate-MODEL-GPU-MODE.json",
    )  # fmt: skip
    link: str | None = option(None, "the simulator's KV link profile (disaggregated and hybrid modes)")


def run_validate(
    base: RunConfig, rates: Sequence[float] | None, options: ValidateOptions, testbed_name: str | None = None
) -> int:
    """Run `base` live (unless `options.live_results` holds the runs) and simulated at each rate (default:
    30/60/90% of the simulated knee); print and write the errors. The simulator models `testbed_name`
    (default `sangam-<gpu>`): its profile, KV link (unless `options.link`) and control delay."""
    testbed = choose_testbed(testbed_name, base.gpu)
    resolver = Resolver(testbed, {"link": options.link})
    profile = resolver.resolve(base).profile
    if profile is None or profile.kv_pages is None:
        raise ValueError(
            f"no measured profile of {base.model} on {base.gpu} in testbed {testbed.name}: run sangam profile"
        )
    setup = resolver.resolve(base, {"pages": profile.kv_pages})  # the pool the profile's worker had
    loads = list(rates) if rates else [round(share * knee(setup), 2) for _, share in SHARES]
    points = []
    labels = [name for name, _ in SHARES] if not rates else [f"{q:g}" for q in loads]
    for label, qps in zip(labels, loads, strict=True):
        cfg = dataclasses.replace(setup.config, qps=qps)
        live_dir = (options.live_results or options.out) / f"live-qps{qps:g}"
        if options.live_results is None:
            run_live_point(cfg, setup.progress, live_dir)
        elif not (live_dir / "summary.json").is_file():
            raise ValueError(
                f"--live-results {options.live_results}: no live run at {qps:g} QPS there ({live_dir.name}/"
                "summary.json missing); give --qps with the rates it holds"
            )
        live = read_summary(live_dir)
        config = live["config"]
        check_same_run(live_dir, config, cfg)
        out = options.out / f"sim-qps{qps:g}"
        sim = simulated(setup, qps, live_pages(config), out, config.get("kv_cache_dtype")).summary
        points.append({"load": label, "qps": qps, "live": live, "sim": sim, "error_pct": compare(live, sim)})
    path = options.report or Path("benchmarks/results") / f"validate-{base.model}-{base.gpu}-{base.mode}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(points, indent=2, sort_keys=True) + "\n")
    print_report(points, path)
    return 0


def run_live_point(cfg: RunConfig, progress: str, out: Path) -> None:
    """`sangam live` of `cfg` on its first `cfg.gpus` GPUs, its forwards per block drawn from `progress`,
    results and iteration log in `out`."""
    from executor.run.live import plan_run, run_live, visible_gpus
    from executor.run.live_options import LiveOptions

    if (visible := visible_gpus()) < cfg.gpus:
        raise ValueError(
            f"sangam validate runs {cfg.mode} live on {cfg.gpus} GPU{'s' if cfg.gpus > 1 else ''} (--gpus), "
            f"{visible} visible; --live-results DIR compares with live runs made elsewhere"
        )
    options = LiveOptions(gpus=tuple(range(cfg.gpus)), model=cfg.model)
    plan = plan_run(dataclasses.replace(cfg, pages=None), options)
    files = RunFiles(out=out, iteration_log=out / "iterations.csv", progress=progress)
    if run_live(plan, options, files, [cfg.qps]) != 0:
        raise RuntimeError(f"the live run at {cfg.qps:g} QPS failed")


def live_pages(config: dict[str, Any]) -> int | None:
    """The KV pages a live run's workers held, from its summary.json's config (None: not known). Files
    written before one name per fact hold `pages` (None: the pool was not given) beside `kv_pages`."""
    pages = config["pages"] if "pages" in config else config.get("kv_pages")
    return pages if isinstance(pages, int) else None


def check_same_run(live_dir: Path, live: dict[str, Any], cfg: RunConfig) -> None:
    """ValueError unless the live run's config is the one about to be simulated."""
    expected = cfg.resolved()  # as the live run's summary records it
    for key in ("layout", "model", "gpu", "num_requests", "seed", "qps"):
        if live.get(key) != (value := expected[key]):
            raise ValueError(
                f"{live_dir}/summary.json: the live run has {key} {live.get(key)!r}, this validation "
                f"{value!r}; give the arguments of that run"
            )


def read_summary(directory: Path) -> dict[str, Any]:
    """A live run's summary.json, of a whole run that served its model on GPUs, whose compared metrics
    are numbers; ValueError (one line) else."""
    where = f"{directory}/summary.json"
    summary = run_summary(directory)
    check_measured(summary["config"], where)
    if summary.get("partial") or not summary.get("completed"):
        raise ValueError(f"{where}: a run that stopped early or completed nothing: nothing to validate")
    for key in (key for key in COMPARED if key in summary):  # runs of older code lack some
        value = summary[key]
        if not finite_number(value) or value < 0:
            raise ValueError(f"{where}: {key} must be a number of 0 or more, got {value!r}")
    return summary


def print_report(points: list[dict[str, Any]], path: Path, console: Console | None = None) -> None:
    """One row per compared metric, one column per load: live / simulated seconds and the simulator's
    error, readable at 80 columns (a cell wraps between its numbers, never inside one)."""
    table = Table(
        title="sangam validate: live / simulated seconds (simulator error)", caption=f"report: {path}",
        box=box.SIMPLE_HEAD, collapse_padding=True,
    )  # fmt: skip
    keys = [k for k in COMPARED if any(k in p["error_pct"] for p in points)]
    table.add_column("metric", no_wrap=True)
    for p in points:
        load = f"\n{p['load']}" if p["load"] != f"{p['qps']:g}" else ""  # a named share of the knee
        table.add_column(f"{p['qps']:g} QPS{load}", justify="right", overflow="fold")
    for key in keys:
        cells = [
            f"{p['live'][key] / 1000:.2f} / {p['sim'][key] / 1000:.2f} ({p['error_pct'][key]:+.1f}%)"
            if key in p["error_pct"]
            else "-"
            for p in points
        ]
        table.add_row(metric_label(key), *cells)
    (console or Console()).print(table)


def metric_label(key: str) -> str:
    """`p99_e2el_ms` -> `p99 e2e`."""
    return key.removesuffix("_ms").replace("e2el", "e2e").replace("_", " ")
