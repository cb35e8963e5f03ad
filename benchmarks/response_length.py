"""What sizing each request's mask buffer by its max_tokens saves against one fixed buffer for every
request (issue 28 item 5).

One trace of ShareGPT-like prompts (the paper's Table 1 fit) whose requests ask for mixed `max_tokens`
(`--mix`, default 64/256/1024, drawn uniformly; each output is cut to its request's max_tokens), run
twice: without its max_tokens column (every request carries the fixed `--mask-len` buffer, the paper's
runs) and with it (each request's buffer is its max_tokens in whole 32-token blocks). Both runs do the
same generation: the same prompts, outputs and forwards per block; only the masks each prefill runs over,
and the KV pages each block holds, differ.

- Simulator (default): `sangam sim` on the shipped H200 testbed (`--testbed`, sangam-h200: LLaDA-8B, our
  executor's measured iteration times, 8 colocated workers) at each `--qps`: mean and p99 end-to-end
  latency, output throughput, prefill tokens per request, and the capacity: the highest rate of the grid
  whose p99 end-to-end latency meets `--slo-p99-s`.
- `--live`: `sangam live` replays of the same two traces at each `--qps`, with the arguments after `--`
  (none given: `--workers 1 --progress fixed:4`, the tiny model on one CPU worker, four forwards per
  block); on one H200, random LLaDA-8B weights and the simulator's forwards per block:
  `python -m benchmarks.response_length --live -n 400 --qps 2 3 -- --gpus 1 --model llada-8b --gpu h200`.

Run: python -m benchmarks.response_length [-n N] [--qps Q ...] [--mix 64,256,1024] [--live] [-- LIVE ARGS]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs.args import positive_float, positive_int
from runs.traces import write_trace
from sangam.workload import TraceRow, sample_lengths

RUNS = ("fixed", "per-request")
CPU_LIVE = ["--workers", "1", "--progress", "fixed:4"]  # the tiny model on one CPU worker, in a minute a run


@dataclass(frozen=True, slots=True)
class Point:
    """One run's figures at one rate."""

    qps: float
    mean_e2el_s: float
    p99_e2el_s: float
    output_tok_s: float
    prefill_tokens: float  # per request: its sequence length times its blocks (every block re-prefills)

    @classmethod
    def read(cls, qps: float, folder: Path) -> Point:
        summary: dict[str, Any] = json.loads((folder / "summary.json").read_text())
        with (folder / "requests.csv").open() as f:
            work = [int(r["seq_len"]) * int(r["n_blocks"]) for r in csv.DictReader(f)]
        return cls(
            qps, summary["mean_e2el_ms"] / 1000, summary["p99_e2el_ms"] / 1000, summary["output_throughput"],
            statistics.fmean(work),
        )  # fmt: skip


def mix_list(text: str) -> tuple[int, ...]:
    """`64,256,1024`: the max_tokens requests choose from."""
    return tuple(positive_int(part) for part in text.split(",") if part)


def mixed_rows(n: int, mix: tuple[int, ...], seed: int) -> list[TraceRow]:
    """`n` ShareGPT-like requests, each with a max_tokens drawn from `mix` and its output cut to it."""
    rng = random.Random(seed)
    rows = []
    for prompt, output in sample_lengths("sharegpt", n, rng):
        cap = rng.choice(mix)
        rows.append(TraceRow(prompt, min(output, cap), max_tokens=cap))
    return rows


def sangam(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def run_points(
    command: str, trace: Path, out: Path, rates: list[float], args: argparse.Namespace
) -> list[Point]:
    """`sangam sim` or `sangam live` over `trace` at `rates`; each point's figures."""
    argv = sangam(
        command, "--trace", str(trace), "--num-requests", str(args.num_requests), "--mask-len",
        str(args.mask_len), "--seed", str(args.seed), "--qps", *map(str, rates), "--out", str(out),
    )  # fmt: skip
    argv += ["--testbed", args.testbed] if command == "sim" else args.extra
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"sangam {command} over {trace.name} failed: {last}")
    folders = [out / f"qps-{q:g}" for q in rates] if len(rates) > 1 else [out]
    return [Point.read(q, folder) for q, folder in zip(rates, folders, strict=True)]


def capacity(points: list[Point], slo_s: float) -> str:
    """The highest rate of the grid (all lower rates meeting it too) whose p99 end-to-end latency meets the
    SLO."""
    best = None
    for p in sorted(points, key=lambda p: p.qps):
        if p.p99_e2el_s > slo_s:
            break
        best = p.qps
    return "none" if best is None else f"{best:g}"


def print_table(title: str, results: dict[str, list[Point]]) -> None:
    print(title)
    header = ("run", "qps", "mean e2e s", "p99 e2e s", "output tok/s", "prefill tok/req")
    widths = (12, 6, 11, 10, 13, 16)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for run, points in results.items():
        for p in points:
            cells = (run, f"{p.qps:g}", f"{p.mean_e2el_s:.2f}", f"{p.p99_e2el_s:.2f}",
                     f"{p.output_tok_s:.0f}", f"{p.prefill_tokens:.0f}")  # fmt: skip
            print(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--num-requests", type=positive_int, default=None,
                        help="requests per run (default: 2000 simulated, 12 live)")  # fmt: skip
    parser.add_argument("--qps", type=positive_float, nargs="+", default=None,
                        help="arrival rates (default: 16 to 32 by 2 simulated, 0.5 live)")  # fmt: skip
    parser.add_argument("--mix", type=mix_list, default=(64, 256, 1024), help="max_tokens to draw from")
    parser.add_argument("--mask-len", type=positive_int, default=1024, help="the fixed buffer, the largest")
    parser.add_argument("--testbed", default="sangam-h200", help="the simulated testbed")
    parser.add_argument("--slo-p99-s", type=positive_float, default=20.0, help="capacity: p99 e2e bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--live", action="store_true", help="replay through sangam live instead")
    parser.add_argument("extra", nargs="*", help="after --: arguments for sangam live")
    args = parser.parse_args()
    live = args.live
    args.num_requests = args.num_requests or (12 if live else 2000)
    rates = args.qps or ([0.5] if live else [float(q) for q in range(16, 33, 2)])
    args.extra = args.extra or (CPU_LIVE if live else [])
    if max(args.mix) > args.mask_len:
        parser.error(f"--mix {max(args.mix)} exceeds --mask-len {args.mask_len}")
    rows = mixed_rows(args.num_requests, args.mix, args.seed)
    with tempfile.TemporaryDirectory(prefix="response-length-") as tmp:
        traces = {"per-request": Path(tmp) / "sized.csv", "fixed": Path(tmp) / "fixed.csv"}
        write_trace(traces["per-request"], rows)
        write_trace(traces["fixed"], [TraceRow(r.prompt_len, r.output_len) for r in rows])
        command = "live" if live else "sim"
        results = {run: run_points(command, traces[run], Path(tmp) / run, rates, args) for run in RUNS}
    mix = "/".join(map(str, args.mix))
    where = f"sangam live {' '.join(args.extra)}" if live else args.testbed
    print_table(
        f"{args.num_requests} requests, max_tokens {mix}, --mask-len {args.mask_len}, {where}", results
    )
    if not live:
        caps = ", ".join(f"{run} {capacity(results[run], args.slo_p99_s)}" for run in RUNS)
        print(f"capacity (highest rate of the grid with p99 e2e <= {args.slo_p99_s:g} s): {caps} QPS")


if __name__ == "__main__":
    main()
