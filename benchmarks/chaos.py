"""Chaos: what worker kills cost a `sangam live` replay on CPU, against the same replay without faults,
and what the simulator predicts for the same kills.

Run: python -m benchmarks.chaos [--mode 2C] [--workers 2] [--kills 2 | --in-turn] [--restart]
     [--requests 60] [--qps 3] [--seed 0] [--out DIR]

1. A fault-free live replay of a seeded trace (tiny LLaDA on CPU workers, forced forwards per block),
   with its iteration log.
2. The same replay while a killer sends SIGKILL to live workers, with `--restart-workers` if asked; kill
   times are taken from the first arrival. Either K random workers at K random times (drawn in the first
   60% of the fault-free run, seeded), or with `--in-turn` every worker index in order, 0 first, the
   first at 10% of the fault-free run and each next once the last victim is back (with `--restart`),
   each while it holds work. A kill only takes a worker whose loss leaves the layout able to serve (a
   colocated or decode-role worker stays up, and a prefill worker too in `<n>P<m>D`; else it waits for
   a restart); worker 0 of a P/D layout is a worker like any other (the launcher hosts the KV links'
   rendezvous).
3. The simulator's twin: the same trace, seed and forwards, `--fail` at the kill times (and, with
   restarts, the observed mean start-up of a restarted worker, its delay after the launcher's back-off,
   as `--restart-after`: the sim restarts under the same back-off), its iteration times from a linear
   fit of the fault-free live iteration log (seconds = a + b * prefill tokens + c * decodes: the CPU
   profile), without and with the failures.

Prints requests lost (not completed) and completed, mean and p99 end-to-end latency and their inflation
against the fault-free run of the same driver, workers lost, requests recovered and forwards redone.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.control.client import SangamClient, SangamError
from executor.run.ports import free_port
from runs.args import positive_float, positive_int
from runs.config import RunConfig, with_arrival_times
from runs.traces import read_trace
from sangam.batcher import Microbatch
from sangam.faults import Failure
from sangam.layout import Kind, Layout, Role, parse_mode
from sangam.progress import parse_progress
from sim.run import simulate

MASK_LEN = 128
PROGRESS = "uniform:8:24"
TINY_PAGES = 4096  # executor.model.live_models.TINY_PAGES: the live run's pages, given to the twin


@dataclass(frozen=True, slots=True)
class Kill:
    worker: int
    at: float  # seconds after the run's first arrival


@dataclass(frozen=True, slots=True)
class Planned:
    """A kill to make: of `worker` (None: a random one) no earlier than `at` seconds after the first
    arrival; a named worker is killed while it holds work, once no earlier victim awaits its restart."""

    at: float
    worker: int | None = None


RESTART_WAIT = re.compile(r"restarting it in ([0-9.]+) s")  # the launcher's line for each restart


@dataclass(slots=True)
class LinearCost:
    """seconds = a + b * prefill tokens + c * decodes: a CostModel fitted to a live iteration log."""

    a: float
    b: float
    c: float

    def seconds(self, mb: Microbatch) -> float:
        return max(0.0, self.a + self.b * mb.prefill_tokens + self.c * len(mb.decodes))


def fit_cost(log: Path) -> LinearCost:
    """Least squares over a live iteration log: an iteration lasts until the worker's next start when its
    loop went straight on (`cycle_s`), else its own span."""
    rows = list(csv.DictReader(log.open()))
    xs, ys = [], []
    for r in rows:
        span = float(r["cycle_s"]) or float(r["end"]) - float(r["start"])
        xs.append((1.0, float(r["prefill_tokens"]), float(r["n_decodes"])))
        ys.append(span)
    normal = [[sum(x[i] * x[j] for x in xs) for j in range(3)] for i in range(3)]
    rhs = [sum(x[i] * y for x, y in zip(xs, ys, strict=True)) for i in range(3)]
    return LinearCost(*solve(normal, rhs))


def solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting of a small dense system."""
    n = len(v)
    a = [[*row, rhs] for row, rhs in zip(m, v, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col and a[col][col]:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] if a[i][i] else 0.0 for i in range(n)]


def write_trace(path: Path, n: int, qps: float, seed: int) -> None:
    rng = random.Random(seed)
    now, lines = 0.0, ["arrival_time,prompt_len,output_len"]
    for _ in range(n):
        now += rng.expovariate(qps)
        lines.append(f"{now:.6f},{rng.randint(4, 40)},{rng.randint(32, MASK_LEN)}")
    path.write_text("\n".join(lines) + "\n")


def live(
    args: argparse.Namespace, trace: Path, out: Path, kills: list[Planned]
) -> tuple[dict[str, Any], list[Kill], float | None]:
    """One live replay; SIGKILL to the workers `kills` plans. Its summary, the kills made and the mean
    start-up of a restarted worker: from a kill to the worker's new registration, less the launcher's
    back-off (None: no restart came back)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "cli.main", "live", "--workers", str(args.workers), "--mode", args.mode,
        "--mask-len", str(MASK_LEN), "--trace", str(trace), "--num-requests", str(args.requests),
        "--progress", PROGRESS, "--seed", str(args.seed), "--port", str(port), "--out", str(out),
        "--iteration-log", str(out / "iterations.csv"), "--log-dir", str(out / "logs"),
    ]  # fmt: skip
    if kills and args.restart:
        argv.append("--restart-workers")
    out.mkdir(parents=True, exist_ok=True)
    table = (out / "table.txt").open("w")  # the run's own table
    proc = subprocess.Popen(argv, stdout=table, stderr=subprocess.PIPE, text=True)
    made: list[Kill] = []
    delays: list[float] = []
    killer = threading.Thread(target=kill_at, args=(port, args, kills, made, delays), daemon=True)
    killer.start()
    _, err = proc.communicate()
    table.close()
    killer.join(timeout=5)
    if not (out / "summary.json").exists():
        raise SystemExit(
            f"chaos: the live run wrote no summary (exit {proc.returncode}): {err.strip()[-400:]}"
        )
    summary = json.loads((out / "summary.json").read_text())
    if not delays:
        return summary, made, None
    waits = [float(w) for w in RESTART_WAIT.findall(err)][: len(delays)]
    return summary, made, max(0.0, (sum(delays) - sum(waits)) / len(delays))


def kill_at(
    port: int, args: argparse.Namespace, kills: list[Planned], made: list[Kill], delays: list[float]
) -> None:
    client = SangamClient(f"127.0.0.1:{port}", timeout=2.0)
    rng = random.Random(args.seed + 1)
    layout = parse_mode(args.mode, args.workers)
    origin = None
    pending = sorted(kills, key=lambda k: k.at)
    waiting: dict[int, tuple[float, int]] = {}  # worker -> (kill time, old pid): restarts to time
    while pending or waiting:
        try:
            status = client.status()
        except SangamError:
            if made:
                return  # the run is over
            time.sleep(0.1)
            continue
        if not status.ready:
            time.sleep(0.1)
            continue
        if origin is None and status.first_arrival:
            origin = status.first_arrival
        for w, (when, pid) in list(waiting.items()):
            state = status.workers[w]
            if state.pid not in (pid, 0) and not state.lost:
                delays.append(time.monotonic() - when)
                del waiting[w]
            elif not args.restart:
                del waiting[w]
        if origin is not None and pending and time.monotonic() - origin >= pending[0].at:
            alive = [w.worker_id for w in status.workers if not w.lost]
            alive = [w for w in alive if servable(layout, status.workers, w)]
            named = pending[0].worker
            if named is not None:  # in turn: busy, and the last victim back
                target = status.workers[named]
                busy = target.outstanding > 0 or target.free_pages < target.pages
                alive = [named] if named in alive and busy and not waiting else []
            if alive:  # else the kill waits: the layout must stay able to serve
                victim = rng.choice(alive)
                pid = status.workers[victim].pid
                os.kill(pid, signal.SIGKILL)
                now = time.monotonic()
                made.append(Kill(victim, now - origin))
                waiting[victim] = (now, pid)
                pending.pop(0)
        time.sleep(0.02)


def servable(layout: Layout, workers: Sequence[Any], victim: int) -> bool:
    """Whether the layout can serve without `victim` (`sangam.router`'s rule): a colocated or decode-role
    worker stays up, and in `<n>P<m>D` a prefill worker too (a hybrid overflows its prefills)."""
    up = [layout.roles[w.worker_id] for w in workers if w.worker_id != victim and not w.lost]
    decode = any(role is not Role.PREFILL for role in up)
    return decode and (layout.kind is not Kind.DISAGGREGATED or Role.PREFILL in up)


def twin(
    args: argparse.Namespace, trace: Path, cost: LinearCost, kills: list[Kill], restart: float | None
) -> dict[str, Any]:
    cfg = RunConfig(
        mode=args.mode, gpus=args.workers, trace=str(trace), num_requests=args.requests, mask_len=MASK_LEN,
        pages=TINY_PAGES, seed=args.seed,
    )  # fmt: skip
    rows = with_arrival_times(cfg, read_trace(trace))
    failures = [Failure(k.worker, k.at) for k in kills]
    return simulate(
        cfg, rows, cost, progress=parse_progress(PROGRESS), failures=failures, restart_after_s=restart
    ).summary


def line(name: str, s: dict[str, Any], base: dict[str, Any], total: int) -> str:
    mean, p99 = s.get("mean_e2el_ms", 0.0) / 1000, s.get("p99_e2el_ms", 0.0) / 1000
    inflate = [
        100 * (mean / (base["mean_e2el_ms"] / 1000) - 1),
        100 * (p99 / (base["p99_e2el_ms"] / 1000) - 1),
    ]
    done = int(s.get("completed", 0))
    return (
        f"{name:<11} {total - done:>5} {done:>5} {mean:>9.3f} {p99:>8.3f} {inflate[0]:>+10.1f}%"
        f" {inflate[1]:>+9.1f}%"
        f" {s.get('workers_lost', 0):>6} {s.get('requests_recovered', 0):>10}"
        f" {s.get('forwards_redone', 0):>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", default="2C")
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--kills", type=positive_int, default=2, help="random kills")
    parser.add_argument(
        "--in-turn", action="store_true", help="kill every worker index in order instead, 0 first"
    )
    parser.add_argument(
        "--restart", action="store_true", help="live: --restart-workers; twin: --restart-after"
    )
    parser.add_argument("--requests", type=positive_int, default=60)
    parser.add_argument("--qps", type=positive_float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="sangam-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    trace = root / "trace.csv"
    write_trace(trace, args.requests, args.qps, args.seed)

    clean, _, _ = live(args, trace, root / "live-clean", [])
    duration = float(clean["duration"])
    if args.in_turn:
        plan = [Planned(0.1 * duration, w) for w in range(args.workers)]
    else:
        rng = random.Random(args.seed)
        plan = [Planned(rng.uniform(0.1, 0.6) * duration) for _ in range(args.kills)]
    chaos, kills, startup = live(args, trace, root / "live-chaos", plan)
    cost = fit_cost(root / "live-clean" / "iterations.csv")
    sim_clean = twin(args, trace, cost, [], None)
    sim_chaos = twin(args, trace, cost, kills, startup)

    restarts = "no restarts"
    if args.restart:
        restarts = "no restart came back in time"
        if startup is not None:
            restarts = f"a restarted worker started {startup:.1f} s after its back-off (measured)"
    print(
        f"chaos: {args.mode} on {args.workers} CPU workers, {args.requests} requests at {args.qps:g} QPS, "
        f"seed {args.seed}; kills " + ", ".join(f"worker {k.worker} at {k.at:.2f} s" for k in kills)
        + f"; {restarts}"
    )  # fmt: skip
    print(
        f"CPU profile fitted to the fault-free live log: {cost.a * 1e3:.2f} ms + "
        f"{cost.b * 1e6:.2f} us/prefill token + {cost.c * 1e3:.2f} ms/decode"
    )
    print(
        f"{'run':<11} {'lost':>5} {'done':>5} {'mean e2e':>9} {'p99 e2e':>8} {'mean infl':>11}"
        f" {'p99 infl':>10} {'w lost':>6} {'recovered':>10} {'redone':>8}"
    )
    total = args.requests
    print(line("live clean", clean, clean, total))
    print(line("live chaos", chaos, clean, total))
    print(line("sim clean", sim_clean, sim_clean, total))
    print(line("sim chaos", sim_chaos, sim_clean, total))
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
