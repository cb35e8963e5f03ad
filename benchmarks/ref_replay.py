"""The reference implementation's server against `sangam live`, end to end: the trace files both replay, and
the comparison of their end-to-end latencies.

    python3 -m benchmarks.ref_replay traces --out DIR --loads 0.5:30,1.5:60 --seed 7
    python3 -m benchmarks.ref_replay compare --reference DIR --ours DIR --json compare.json

`traces` writes `trace-qps<Q>.csv` per load (arrival_time, prompt_len, output_len): ShareGPT-like lengths
from `sangam.workload` (the same seed gives the same requests at every load; rows whose output does not fit
`--mask-len` or whose prompt is over `--prompt-cap` are drawn again), and Poisson arrivals with gaps
clipped at `--clip`/lambda as the reference's harness clips them. Both sides replay these same files:
`benchmarks/refpeer/replay_client.py` against the reference, `sangam live --trace` against ours.

`compare` reads the reference's `ref-qps<Q>.json` (from the replay client) and our `ours-qps<Q>/requests.csv`
(from `sangam live --out`) and gives mean, median and p99 end-to-end latency per load and side, with the
reference's over ours; it writes them as JSON and prints a table. The end-to-end latency of both sides is
the server's own (arrival at its scheduler to completion); the reference's client-side submit -> done is
reported beside it.
`benchmarks/h200_ref_replay.sh` runs everything on one H200.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs.config import RunConfig, with_arrival_times
from runs.traces import write_trace
from sangam.workload import TraceRow, sample_lengths

STATS = ("mean", "median", "p99")


@dataclass(frozen=True)
class Load:
    """One point of the replay: an arrival rate and its number of requests."""

    qps: float
    requests: int

    @property
    def name(self) -> str:
        return f"qps{self.qps:g}"


def parse_loads(text: str) -> list[Load]:
    """`0.5:30,1.5:60` -> two loads; ValueError on anything else."""
    loads = []
    for part in text.split(","):
        qps, sep, n = part.partition(":")
        try:
            load = Load(float(qps), int(n))
        except ValueError:
            raise ValueError(f"--loads: expected QPS:REQUESTS[,QPS:REQUESTS...], got {part!r}") from None
        if not sep or not load.qps > 0 or load.requests <= 0:
            raise ValueError(f"--loads: expected QPS:REQUESTS with both positive, got {part!r}")
        loads.append(load)
    return loads


def trace_rows(load: Load, seed: int, mask_len: int, prompt_cap: int, clip: float | None) -> list[TraceRow]:
    """The requests of one load: ShareGPT lengths that fit (redrawn otherwise), then clipped Poisson
    arrivals; lengths do not depend on the load, so a smaller load's requests begin the larger's."""
    cfg = RunConfig(trace="sharegpt", num_requests=load.requests, qps=load.qps, arrival_clip=clip, seed=seed)
    rng = cfg.rng("lengths")
    rows: list[TraceRow] = []
    while len(rows) < load.requests:
        ((prompt, output),) = sample_lengths("sharegpt", 1, rng)
        if output <= mask_len and prompt <= prompt_cap:
            rows.append(TraceRow(prompt, output))
    return with_arrival_times(cfg, rows)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(values: list[float]) -> dict[str, float]:
    """Mean, median and p99 in milliseconds of latencies in seconds."""
    if not values:
        return dict.fromkeys(STATS, math.nan)
    ms = [v * 1000 for v in values]
    return {"mean": statistics.fmean(ms), "median": statistics.median(ms), "p99": percentile(ms, 99)}


def reference_latencies(path: Path) -> dict[str, Any]:
    """The completed requests' latencies (s) of one replay-client JSON, and its counts."""
    data = json.loads(path.read_text())
    ok = [r for r in data["rows"] if r.get("status") == "COMPLETED"]
    return {
        "server": [r["e2el_server"] for r in ok],
        "client": [r["e2el_client"] for r in ok],
        "requests": data["requests"],
        "completed": len(ok),
        "forwards_as_forced": data.get("forwards_as_forced"),
    }


def our_latencies(path: Path) -> list[float]:
    """The e2el column (s) of one `sangam live --out` requests.csv."""
    with path.open(newline="") as f:
        return [float(r["e2el"]) for r in csv.DictReader(f)]


def compare_load(reference: dict[str, Any], ours: list[float], requests: int) -> dict[str, Any]:
    """One load's statistics per side and the reference's over ours."""
    ref = latency_stats(reference["server"])
    our = latency_stats(ours)
    return {
        "requests": requests,
        "reference": {
            "completed": reference["completed"],
            "forwards_as_forced": reference["forwards_as_forced"],
            "e2el_ms": ref,
            "client_e2el_ms": latency_stats(reference["client"]),
        },
        "ours": {"completed": len(ours), "e2el_ms": our},
        "ratio": {k: ref[k] / our[k] if our[k] else math.nan for k in STATS},
    }


def table(result: dict[str, dict[str, Any]]) -> str:
    """A markdown table of a comparison: one row per load."""
    lines = [
        "| load | requests | reference mean / median / p99 ms | ours mean / median / p99 ms | "
        "reference / ours (mean, median, p99) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, point in result.items():
        ref, our, ratio = point["reference"]["e2el_ms"], point["ours"]["e2el_ms"], point["ratio"]
        done = f"{point['reference']['completed']}/{point['ours']['completed']} of {point['requests']}"
        lines.append(
            f"| {name} | {done} | {' / '.join(f'{ref[k]:.0f}' for k in STATS)} | "
            f"{' / '.join(f'{our[k]:.0f}' for k in STATS)} | {', '.join(f'{ratio[k]:.2f}' for k in STATS)} |"
        )
    return "\n".join(lines)


def traces(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for load in parse_loads(args.loads):
        rows = trace_rows(load, args.seed, args.mask_len, args.prompt_cap, args.clip)
        path = args.out / f"trace-{load.name}.csv"
        write_trace(path, rows)
        span = rows[-1].arrival_time or 0.0
        print(f"{path}: {len(rows)} requests over {span:.1f} s")
    return 0


def compare(args: argparse.Namespace) -> int:
    result: dict[str, dict[str, Any]] = {}
    for ref_path in sorted(args.reference.glob("ref-qps*.json")):
        name = ref_path.stem.removeprefix("ref-")
        ours_path = args.ours / f"ours-{name}" / "requests.csv"
        if not ours_path.is_file():
            print(f"{name}: no {ours_path}, skipped", file=sys.stderr)
            continue
        reference = reference_latencies(ref_path)
        result[name] = compare_load(reference, our_latencies(ours_path), reference["requests"])
    if not result:
        raise ValueError(
            f"no load has both {args.reference}/ref-qpsQ.json and {args.ours}/ours-qpsQ/requests.csv"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("traces", help="write one trace file per load")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--loads", default="0.5:30,1.5:60", help="QPS:REQUESTS,...")
    t.add_argument("--seed", type=int, default=7)
    t.add_argument("--mask-len", type=int, default=512, help="the mask buffer; longer outputs are redrawn")
    t.add_argument("--prompt-cap", type=int, default=1024, help="longer prompts are redrawn")
    t.add_argument("--clip", type=float, default=3.0, help="clip gaps at CLIP/lambda (0: no clip)")
    c = commands.add_parser("compare", help="the latencies of both sides per load")
    c.add_argument("--reference", type=Path, required=True, help="folder of ref-qpsQ.json")
    c.add_argument("--ours", type=Path, required=True, help="folder of ours-qpsQ/requests.csv")
    c.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "traces":
            if args.clip == 0:
                args.clip = None
            return traces(args)
        return compare(args)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
