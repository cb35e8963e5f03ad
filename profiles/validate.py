"""`sangam validate`: the same trace live on the GPU and in the simulator, and their differences.

The loads are placed relative to the simulated knee: the lowest swept QPS at which the simulated
mean end-to-end latency exceeds twice its value at the lowest rate; the three loads are 30%, 60%
and 90% of it unless given. Live and sim runs share the seed, hence the lengths, arrivals and every
block's forwards (the live workers force the progress model's schedule), and the KV pages (the sim takes
the live run's). Disaggregated and hybrid layouts also compare each pool's queueing and the KV transfer
time; `--link` gives the simulator a measured link profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from profiles.store import Profile, load_profile
from sangam.config import RunConfig, synthetic_rows
from sim.cluster import LinkSpec
from sim.links import load_link
from sim.run import simulate

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


def knee(base: RunConfig, profile: Profile, link: LinkSpec) -> float:
    """The lowest swept QPS whose simulated mean e2e latency is over twice the lowest rate's."""
    cost = profile.cost_model()
    workers = base.layout.num_workers
    first = None
    for per_worker in SWEEP:
        cfg = dataclasses.replace(base, qps=per_worker * workers)
        mean = simulate(cfg, synthetic_rows(cfg), cost, link=link).summary["mean_e2el_ms"]
        first = first or mean
        if mean > 2 * first:
            return per_worker * workers
    return SWEEP[-1] * workers


def compare(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, float]:
    """Signed error of the simulator against the live run, in percent, per compared metric.

    Metrics under 10 ms live are left out: zero transfers, and a colocated request's decode queue (about
    2 ms live, the pauses between each block's prefill and its first decode; none simulated).
    """
    return {key: 100 * (sim[key] - live[key]) / live[key] for key in COMPARED if live.get(key, 0) >= 10.0}


def run_validate(args: argparse.Namespace) -> int:
    from sangam.cli import main as sangam

    profile = load_profile(args.model, args.gpu)
    if profile is None or profile.kv_pages is None:
        raise ValueError(f"no measured profile of {args.model} on {args.gpu}: run sangam profile first")
    base = RunConfig(
        mode=args.mode, model=args.model, gpu=args.gpu, gpus=args.gpus, num_requests=args.num_requests,
        seed=args.seed, pages=profile.kv_pages,
    )  # fmt: skip
    link = load_link(args.link) if args.link else LinkSpec()
    loads = args.qps or [round(share * knee(base, profile, link), 2) for _, share in SHARES]
    common = ["--mode", args.mode, "--model", args.model, "--gpu", args.gpu, "--seed", str(args.seed)]
    common += ["--num-requests", str(args.num_requests)]
    points = []
    labels = [name for name, _ in SHARES] if args.qps is None else [f"{q:g}" for q in loads]
    for label, qps in zip(labels, loads, strict=True):
        live_dir = (args.live_results or args.out) / f"live-qps{qps:g}"
        if args.live_results is None:
            live_args = ["live", *common, "--gpus", str(args.gpus), "--qps", str(qps), "--out", str(live_dir)]
            if sangam([*live_args, "--iteration-log", str(live_dir / "iterations.csv")]) != 0:
                raise RuntimeError(f"the live run at {qps:g} QPS failed")
        if args.live_results is not None and not (live_dir / "summary.json").is_file():
            raise ValueError(
                f"--live-results {args.live_results}: no live run at {qps:g} QPS there ({live_dir.name}/"
                "summary.json missing); give --qps with the rates it holds"
            )
        live = read_summary(live_dir)
        check_same_run(live_dir, live.get("config", {}), dataclasses.replace(base, qps=qps))
        sim_dir = args.out / f"sim-qps{qps:g}"
        sim_args = ["sim", *common, "--gpus", str(args.gpus), "--qps", str(qps), "--out", str(sim_dir)]
        sim_args += ["--pages", str(live.get("config", {}).get("pages") or profile.kv_pages)]
        sim_args += ["--link", args.link] if args.link else []
        if sangam(sim_args) != 0:
            raise RuntimeError(f"the simulation at {qps:g} QPS failed")
        sim = read_summary(sim_dir)
        points.append({"load": label, "qps": qps, "live": live, "sim": sim, "error_pct": compare(live, sim)})
    path = args.report or Path("benchmarks/results") / f"validate-{args.model}-{args.gpu}-{args.mode}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(points, indent=2, sort_keys=True) + "\n")
    print_report(points, path)
    return 0


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
    summary: dict[str, Any] = json.loads((directory / "summary.json").read_text())
    return summary


def print_report(points: list[dict[str, Any]], path: Path) -> None:
    table = Table(title="sangam validate: simulator vs live (seconds)", caption=f"report: {path}")
    keys = [k for k in COMPARED if any(k in p["error_pct"] for p in points)]
    for name in ("load", "QPS", *(f"{key} live / sim (err %)" for key in keys)):
        table.add_column(name, justify="right")
    for p in points:
        errors = p["error_pct"]
        cells = [
            f"{p['live'][k] / 1000:.2f} / {p['sim'][k] / 1000:.2f} ({errors.get(k, float('nan')):+.1f})"
            for k in keys
        ]
        table.add_row(p["load"], f"{p['qps']:g}", *cells)
    Console(width=200).print(table)
