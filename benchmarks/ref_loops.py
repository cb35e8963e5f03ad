"""The reference implementation's loops measured through its own servers (issue 32, item 1): the request
plans `benchmarks/h200_ref_loops.sh` replays, and the analysis of what its timing shim
(`benchmarks/refpeer/shim/ref_timing.py`) logged.

    python3 -m benchmarks.ref_loops plans --out DIR
    python3 -m benchmarks.ref_loops analyze --logs DIR --json summary.json [--meta KEY=VALUE ...]

`plans` writes the trace files the replay client sends: `batch-B<b>.csv` (B requests at once, one prompt
length, a few blocks each: the colocated sweep), `burst.csv` (prefill-only requests at once: one block each,
committed by the prefill's own forward, so the hybrid launcher's prefill worker runs them back to back with
no KV to send) and `hybrid.csv` (ShareGPT-like lengths that fit the hybrid launcher's mask, clipped Poisson
arrivals).

`analyze` reads DIR/phases.jsonl (the script's marks: which plan ran when) and DIR/<launcher>/*.jsonl (one
file per process of that launcher) and prints: per forwards-per-block D and decodes per iteration, the
colocated worker's iteration wall time (one `_run_batch` start to the next) and its parts; per block, its
last forward's end to its next prefill; for the hybrid launcher, the scheduler's `TriggerKVTransfer` on its
event loop, each transfer's bytes and times, the decode side's wait from KV received to admitted, and the
prefill worker's GPU call alone, beside a send, and back to back in the burst, against the profile of the
reference's executor. Times are the shim's monotonic nanoseconds, shown in milliseconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.ref_replay import Load, percentile, trace_rows
from runs.traces import write_trace
from sangam.workload import TraceRow

MS = 1e6  # nanoseconds per millisecond
DECODE_BINS = (1, 2, 4, 8, 16, 32, 64)


# ----- plans -------------------------------------------------------------------------------------------


def batch_rows(batch: int, prompt: int, output: int) -> list[TraceRow]:
    """B requests arriving together."""
    return [TraceRow(prompt, output, 0.0) for _ in range(batch)]


def burst_rows(prompts: Sequence[int], each: int) -> list[TraceRow]:
    """`each` one-block requests of every prompt length, all at once, lengths interleaved."""
    return [TraceRow(p, 32, 0.0) for _ in range(each) for p in prompts]


def plans(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for b in args.batches:
        write_trace(args.out / f"batch-B{b}.csv", batch_rows(b, args.prompt, args.output))
    write_trace(args.out / "burst.csv", burst_rows(args.burst_prompts, args.burst_each))
    load = Load(args.hybrid_qps, args.hybrid_requests)
    rows = trace_rows(load, args.seed, args.hybrid_mask, args.hybrid_prompt_cap, 3.0)
    write_trace(args.out / "hybrid.csv", rows)
    blocks = sum(math.ceil(r.output_len / 32) for r in rows)
    print(
        f"{args.out}: batch-B{{{','.join(map(str, args.batches))}}} ({args.prompt}+{args.output} tokens), "
        f"burst ({len(args.burst_prompts) * args.burst_each} prefills), "
        f"hybrid ({len(rows)} requests, {blocks} "
        f"blocks, {rows[-1].arrival_time:.1f} s)"
    )
    return 0


# ----- reading the logs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One replayed plan: its name (batch-B16-D8, burst, hybrid-D8) and monotonic window."""

    name: str
    t0: int
    t1: int

    def holds(self, t: int) -> bool:
        return self.t0 <= t <= self.t1


def read_phases(path: Path) -> list[Phase]:
    """Pairs of start/end marks -> phases; an unfinished start ends at the last mark seen."""
    starts: dict[str, int] = {}
    phases = []
    last = 0
    for line in path.read_text().splitlines():
        mark = json.loads(line)
        last = max(last, mark["t"])
        if mark["edge"] == "start":
            starts[mark["name"]] = mark["t"]
        elif mark["name"] in starts:
            phases.append(Phase(mark["name"], starts.pop(mark["name"]), mark["t"]))
    phases += [Phase(name, t, max(last, t)) for name, t in starts.items()]
    return sorted(phases, key=lambda p: p.t0)


def read_events(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every process file of one launcher: process name (file stem without its pid) -> events in order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*.jsonl")):
        name = path.stem.rsplit("-", 1)[0]
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    out[name].append(json.loads(line))
                except json.JSONDecodeError:  # a process killed mid-line: its last line only
                    continue
    return dict(out)


def forwards_per_block(phase: str) -> int | None:
    """D of a phase named ...-D<d>."""
    tail = phase.rsplit("-D", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


def decode_bin(n: int) -> int:
    """The largest of DECODE_BINS not over n (0 for none)."""
    return max((b for b in DECODE_BINS if b <= n), default=0)


def part(parts: dict[str, Any], name: str) -> int:
    """Nanoseconds of one accumulated part (0 when absent)."""
    value = parts.get(name)
    return int(value[0]) if value else 0


def stats(values: Iterable[float]) -> dict[str, float]:
    xs = list(values)
    if not xs:
        return {"n": 0, "median": math.nan, "p90": math.nan, "mean": math.nan}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p90": percentile(xs, 90),
        "mean": statistics.fmean(xs),
    }


# ----- colocated ---------------------------------------------------------------------------------------

ITERATION_PARTS = (
    "gpu",
    "gpu_checks",
    "checks",
    "report_rpc",
    "report_build",
    "free",
    "rest",
    "evict",
    "evict_checks",
    "drain",
    "admit",
    "collect",
    "other",
)


def iteration_parts(it: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """One iteration's wall time (its start to the next's) and its parts, in ms. `after` is the next
    iteration's record, whose `before` holds what the main thread did in between."""
    gpu = it["gpu"] or {"t0": it["t0"], "t1": it["t0"], "parts": {}}
    ins, between = it["parts"], after["before"]
    gpu_ns = gpu["t1"] - gpu["t0"]
    make_report = part(ins, "_make_batch_report")
    report = part(ins, "_report_batch")
    checks = part(ins, "_block_is_complete")
    free = part(ins, "_do_free_state")
    evict = part(between, "_evict_completed")
    drain = part(between, "_drain_incoming") + part(between, "_drain_external_decodes")
    admit = part(between, "_admit_ready_decode_requests")
    collect = part(between, "_collect_prefill_batch")
    wall = after["t0"] - it["t0"]
    inside = it["t1"] - it["t0"]
    ns = {
        "wall": wall,
        "gpu": gpu_ns,
        "gpu_checks": part(gpu["parts"], "_block_is_complete"),
        "checks": checks,
        "report_rpc": report,
        "report_build": make_report - report,
        "free": free,
        "rest": inside - gpu_ns - checks - make_report - free,
        "evict": evict,
        "evict_checks": part(between, "_block_is_complete"),
        "drain": drain,
        "admit": admit,
        "collect": collect,
        "other": wall - inside - evict - drain - admit - collect,
    }
    return {k: v / MS for k, v in ns.items()}


def colocated_iterations(events: list[dict[str, Any]], phases: list[Phase]) -> list[dict[str, Any]]:
    """Every iteration of the colocated worker inside a D-phase, with its parts; the last of each phase
    (no next start in it) is left out, and so is one whose next start follows an idle wait (more than the
    two drains of a busy pass)."""
    iters = [e for e in events if e["ev"] == "iter"]
    rows = []
    for it, nxt in itertools.pairwise(iters):
        phase = next((p for p in phases if p.holds(it["t0"]) and p.holds(nxt["t0"])), None)
        d = forwards_per_block(phase.name) if phase else None
        if d is None or nxt["before"].get("_drain_incoming", [0, 0])[1] > 2:
            continue
        rows.append(
            {
                "phase": phase.name,
                "D": d,
                "decodes": len(it["decodes"]),
                "prefills": len(it["prefills"]),
                **iteration_parts(it, nxt),
            }
        )
    return rows


def iteration_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians (and the wall's p90) per D, iteration kind and decode bin."""
    groups: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        kind = "mixed" if r["prefills"] else "decode"
        groups[(r["D"], kind, decode_bin(r["decodes"]))].append(r)
    table = []
    for (d, kind, b), rs in sorted(groups.items()):
        wall = stats(r["wall"] for r in rs)
        table.append(
            {
                "D": d,
                "kind": kind,
                "decodes_from": b,
                "n": len(rs),
                "wall_median": wall["median"],
                "wall_p90": wall["p90"],
                **{p: statistics.median(r[p] for r in rs) for p in ITERATION_PARTS},
            }
        )
    return table


def loop_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per D and exact decodes of the decode-only iterations: medians of what the loop spends beyond the GPU
    call (wall - gpu), of its report (build and blocking call) and of the rest (the difference), in ms."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r["prefills"]:
            groups[(r["D"], r["decodes"])].append(r)
    return [
        {
            "D": d,
            "decodes": n,
            "n": len(rs),
            "beyond_gpu": statistics.median(r["wall"] - r["gpu"] for r in rs),
            "report": statistics.median(r["report_rpc"] + r["report_build"] for r in rs),
            "rest": statistics.median(r["wall"] - r["gpu"] - r["report_rpc"] - r["report_build"] for r in rs),
        }
        for (d, n), rs in sorted(groups.items())
    ]


def block_gaps(events: list[dict[str, Any]], phases: list[Phase]) -> list[dict[str, Any]]:
    """Per block finished in decode and followed by its request's next block: its last forward's end (the
    GPU call that completed it) -> the next block's EnqueueRequest at the worker -> that block's prefill GPU
    call starting, in ms, with the phase's D."""
    done: dict[tuple[str, int], int] = {}
    enqueued: dict[tuple[str, int], int] = {}
    starts: dict[tuple[str, int], int] = {}
    for e in events:
        if e["ev"] == "enqueue":
            enqueued.setdefault((e["rid"], e["block"]), e["t0"])
        elif e["ev"] == "iter" and e["gpu"]:
            blocks = {rid: b for rid, b in e["decodes"]}
            for rid, _ in e["parts"].get("freed", []):
                if rid in blocks:
                    done[(rid, blocks[rid])] = e["gpu"]["t1"]
            for rid, b, _ in e["prefills"]:
                starts.setdefault((rid, b), e["gpu"]["t0"])
    gaps = []
    for (rid, b), t_done in done.items():
        t_next = starts.get((rid, b + 1))
        t_enq = enqueued.get((rid, b + 1))
        phase = next((p for p in phases if p.holds(t_done)), None)
        d = forwards_per_block(phase.name) if phase else None
        if t_next is None or t_enq is None or d is None:
            continue
        gaps.append(
            {
                "phase": phase.name if phase else "",
                "D": d,
                "gap": (t_next - t_done) / MS,
                "to_enqueue": (t_enq - t_done) / MS,
                "enqueue_to_prefill": (t_next - t_enq) / MS,
            }
        )
    return gaps


# ----- hybrid ------------------------------------------------------------------------------------------


def _overlaps(a0: int, a1: int, spans: list[tuple[int, int]]) -> bool:
    return any(s0 < a1 and a0 < s1 for s0, s1 in spans)


def prefill_rows(events: list[dict[str, Any]], phases: list[Phase]) -> list[dict[str, Any]]:
    """The prefill worker's batches: phase, tokens, GPU call, whole batch (report included) and the gap
    since the previous batch ended, in ms, and whether a KV send of this process overlapped its GPU call."""
    sends = [(e["t0"], e["t1"]) for e in events if e["ev"] == "send"]
    rows = []
    previous_end = None
    for e in (e for e in events if e["ev"] == "pbatch" and e["gpu"]):
        phase = next((p.name for p in phases if p.holds(e["t0"])), "")
        g0, g1 = e["gpu"]["t0"], e["gpu"]["t1"]
        rows.append(
            {
                "phase": phase,
                "items": len(e["prefills"]),
                "tokens": sum(t for _, _, t in e["prefills"]),
                "gpu": (g1 - g0) / MS,
                "batch": (e["t1"] - e["t0"]) / MS,
                "report_rpc": part(e["parts"], "_report_batch") / MS,
                "since_previous": (e["t0"] - previous_end) / MS if previous_end else math.nan,
                "with_send": _overlaps(g0, g1, sends),
            }
        )
        previous_end = e["t1"]
    return rows


def transfers(by_process: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Trigger, send, receive and admission per block, joined on the request id and order."""
    events = [e for evs in by_process.values() for e in evs]
    triggers = [e for e in events if e["ev"] == "call" and e.get("rpc") == "TriggerKVTransfer"]
    sends = [e for e in events if e["ev"] == "send"]
    recvs = [e for e in events if e["ev"] == "recv"]
    coords = [e for e in events if e["ev"] == "coord"]
    admitted: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e["ev"] == "iter":
            for rid, _, t in e["before"].get("admitted", []):
                admitted[rid].append(t)
    waits = []
    for r in recvs:
        later = [t for t in admitted.get(r["rid"], []) if t >= r["t1"]]
        if later:
            waits.append((min(later) - r["t1"]) / MS)
    handoff = []
    for tr in triggers:
        later = [t for t in admitted.get(tr["rid"], []) if t >= tr["t0"]]
        if later:
            handoff.append((min(later) - tr["t0"]) / MS)
    gbps = [s["bytes"] / (s["t1"] - s["t0"]) for s in sends if s["t1"] > s["t0"]]
    return {
        "prefill_end_to_send_ms": stats(prefill_end_to_send(events)),
        **received_to_admitted(events),
        "trigger_ms": stats((t["t1"] - t["t0"]) / MS for t in triggers),
        "trigger_handled_ms": stats((e["t1"] - e["t0"]) / MS for e in events if e["ev"] == "trigger_rpc"),
        "coordinate_ms": stats((c["t1"] - c["t0"]) / MS for c in coords),
        "send_ms": stats((s["t1"] - s["t0"]) / MS for s in sends),
        "send_stage_d2h_ms": stats(part(s.get("parts", {}), "stage_d2h") / MS for s in sends),
        "send_bytes": stats(s["bytes"] for s in sends),
        "send_gb_per_s": stats(gbps),
        "recv_ms": stats((r["t1"] - r["t0"]) / MS for r in recvs),
        "recv_gloo_ms": stats(part(r.get("parts", {}), "gloo_recv") / MS for r in recvs),
        "recv_stage_h2d_ms": stats(part(r.get("parts", {}), "stage_h2d") / MS for r in recvs),
        "received_to_admitted_ms": stats(waits),
        "trigger_to_admitted_ms": stats(handoff),
        "scheduler_handlers_ms": {
            name: stats((e["t1"] - e["t0"]) / MS for e in events if e.get("handler") == name)
            for name in sorted({e["handler"] for e in events if e["ev"] == "handler"})
        },
    }


def prefill_end_to_send(events: list[dict[str, Any]]) -> list[float]:
    """Per transfer: from the end of the prefill batch that made its KV (its report sent) to its send's start,
    in ms."""
    batch_end = {
        (rid, block): e["t1"] for e in events if e["ev"] == "pbatch" for rid, block, _ in e["prefills"]
    }
    out = []
    for c in (e for e in events if e["ev"] == "coord"):
        end = batch_end.get((c["rid"], c["block"]))
        starts = [
            s["t0"] for s in events if s["ev"] == "send" and s["rid"] == c["rid"] and s["t0"] >= c["t0"]
        ]
        if end is not None and starts:
            out.append((min(starts) - end) / MS)
    return out


def received_to_admitted(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """From a block's KV received to the decode worker admitting it, in ms, split by whether the worker was
    inside an iteration when the KV landed (busy) or waiting for work (idle)."""
    iters = [(e["t0"], e["t1"]) for e in events if e["ev"] == "iter"]
    admitted: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e["ev"] == "iter":
            for rid, _, t in e["before"].get("admitted", []):
                admitted[rid].append(t)
    waits: dict[bool, list[float]] = {False: [], True: []}
    for r in (e for e in events if e["ev"] == "recv"):
        later = [t for t in admitted.get(r["rid"], []) if t >= r["t1"]]
        if later:
            busy = any(t0 < r["t1"] < t1 for t0, t1 in iters)
            waits[busy].append((min(later) - r["t1"]) / MS)
    return {
        "received_to_admitted_idle_ms": stats(waits[False]),
        "received_to_admitted_busy_ms": stats(waits[True]),
    }


def prefill_comparison(rows: list[dict[str, Any]], profile: Any) -> list[dict[str, Any]]:
    """Per phase and tokens of one-request batches: the GPU call alone and beside a send (medians), and
    the profile's time for that prefill where a profile is given."""
    groups: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    gaps: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in rows:
        if r["items"] == 1:
            groups[(r["phase"], r["tokens"], r["with_send"])].append(r["gpu"])
            if not math.isnan(r["since_previous"]):
                gaps[(r["phase"], r["tokens"])].append(r["since_previous"])
    out = []
    for phase, tokens in sorted({(p, t) for p, t, _ in groups}):
        alone, beside = groups.get((phase, tokens, False), []), groups.get((phase, tokens, True), [])
        out.append(
            {
                "phase": phase,
                "tokens": tokens,
                "n_alone": len(alone),
                "alone_ms": statistics.median(alone) if alone else math.nan,
                "n_with_send": len(beside),
                "with_send_ms": statistics.median(beside) if beside else math.nan,
                "since_previous_ms": statistics.median(gaps[(phase, tokens)])
                if gaps[(phase, tokens)]
                else math.nan,
                "profile_ms": profile_prefill_ms(profile, tokens),
            }
        )
    return out


def gpu_over_profile(events: list[dict[str, Any]], phases: list[Phase], profile: Any) -> dict[str, Any]:
    """Per iteration kind (prefill, decode, mixed): each GPU call of a worker (colocated `iter` or prefill
    `pbatch`) inside a plan's phase over the profile's time for the same microbatch (a decode's sequence is
    its latest prefill's tokens)."""
    from sangam.batcher import Microbatch

    cost = profile.cost_model()
    seq: dict[str, int] = {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e["ev"] not in ("iter", "pbatch") or not e["gpu"]:
            continue
        for rid, _, tokens in e["prefills"]:
            seq[rid] = tokens
        if not any(p.holds(e["t0"]) for p in phases) or any(
            rid not in seq for rid, _ in e.get("decodes", [])
        ):
            continue
        decodes = tuple(_request(seq[rid]) for rid, _ in e.get("decodes", []))
        prefills = tuple(_request(tokens) for _, _, tokens in e["prefills"])
        mb = Microbatch(decodes, prefills, waiting=0, deficit_before=0, budget=0.0, deficit_after=0)
        kind = "mixed" if decodes and prefills else "prefill" if prefills else "decode"
        ratios[kind].append((e["gpu"]["t1"] - e["gpu"]["t0"]) / 1e9 / cost.seconds(mb))
    return {kind: stats(rs) for kind, rs in sorted(ratios.items())}


def _request(tokens: int) -> Any:
    """A request whose every prefill runs over `tokens` tokens (one 32-token block)."""
    from sangam.request import Request

    return Request(0, 0.0, tokens - 32, 32, 32, (1,))


def profile_prefill_ms(profile: Any, tokens: int) -> float:
    """The profile's time of one prefill over `tokens` tokens (NaN without a profile)."""
    if profile is None:
        return math.nan
    from sangam.batcher import Microbatch

    mb = Microbatch(
        decodes=(), prefills=(_request(tokens),), waiting=0, deficit_before=0, budget=0.0, deficit_after=0
    )
    return float(profile.cost_model().seconds(mb)) * 1000


# ----- the summary -------------------------------------------------------------------------------------


def analyze_logs(logs: Path, profile: Any) -> dict[str, Any]:
    """Everything `analyze` prints, as one dict."""
    phases = read_phases(logs / "phases.jsonl")
    result: dict[str, Any] = {"phases": [{"name": p.name, "seconds": (p.t1 - p.t0) / 1e9} for p in phases]}
    colocated = read_events(logs / "colocated") if (logs / "colocated").is_dir() else {}
    worker = colocated.get("colocated-0", [])
    if worker:
        rows = colocated_iterations(worker, phases)
        gaps = block_gaps(worker, phases)
        result["colocated"] = {
            "iterations": iteration_table(rows),
            "loop_points": loop_points(rows),
            "block_gaps": {
                str(d): {k: stats(g[k] for g in gs) for k in ("gap", "to_enqueue", "enqueue_to_prefill")}
                for d, gs in sorted(_by(gaps, "D").items())
            },
            "block_gaps_by_phase": {
                name: {k: stats(g[k] for g in gs) for k in ("gap", "to_enqueue", "enqueue_to_prefill")}
                for name, gs in _by(gaps, "phase").items()
            },
            "gpu_over_profile": gpu_over_profile(worker, phases, profile) if profile else {},
            "capture_s": {
                str(e["batch_size"]): (e["t1"] - e["t0"]) / 1e9 for e in worker if e["ev"] == "capture"
            },
        }
    hybrid = read_events(logs / "hybrid") if (logs / "hybrid").is_dir() else {}
    if hybrid:
        prefills = prefill_rows(hybrid.get("prefill-0", []), phases)
        result["hybrid"] = {
            "transfers": transfers(hybrid),
            "prefills": prefill_comparison(prefills, profile),
            "burst_gpu_over_profile": gpu_over_profile(
                hybrid.get("prefill-0", []), [p for p in phases if p.name == "burst"], profile
            )
            if profile
            else {},
        }
    return result


def _by(rows: list[dict[str, Any]], key: str) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r[key]].append(r)
    return out


def _f(x: float) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.2f}"


def tables(result: dict[str, Any]) -> str:
    """The summary as markdown tables."""
    lines = []
    col = result.get("colocated")
    if col:
        lines += [
            "Colocated worker, per iteration (ms; medians, wall also p90):",
            "",
            "| D | kind | decodes >= | n | wall | wall p90 | " + " | ".join(ITERATION_PARTS) + " |",
            "|" + " ---: |" * (6 + len(ITERATION_PARTS)),
        ]
        for r in col["iterations"]:
            cells = [r["D"], r["kind"], r["decodes_from"], r["n"], _f(r["wall_median"]), _f(r["wall_p90"])]
            lines.append("| " + " | ".join(map(str, cells + [_f(r[p]) for p in ITERATION_PARTS])) + " |")
        lines += ["", "Per block, last forward's end -> next prefill (ms; median / p90, n):", ""]
        for d, g in col["block_gaps"].items():
            lines.append(
                f"- D = {d}: gap {_f(g['gap']['median'])} / {_f(g['gap']['p90'])} (n {g['gap']['n']}); "
                "to the "
                f"worker's EnqueueRequest {_f(g['to_enqueue']['median'])}; EnqueueRequest -> prefill "
                f"{_f(g['enqueue_to_prefill']['median'])}"
            )
        if col["capture_s"]:
            lines.append(
                "- graph capture per bucket (s): "
                + ", ".join(f"{b}: {s:.2f}" for b, s in col["capture_s"].items())
            )
    hyb = result.get("hybrid")
    if hyb:
        lines += ["", "Hybrid 1P1D on one GPU, per transfer (ms unless stated; median / p90 / n):", ""]
        for key, s in hyb["transfers"].items():
            if key == "scheduler_handlers_ms":
                continue
            lines.append(f"- {key}: {_f(s['median'])} / {_f(s['p90'])} / {s['n']}")
        for name, s in hyb["transfers"]["scheduler_handlers_ms"].items():
            lines.append(f"- scheduler {name}: {_f(s['median'])} / {_f(s['p90'])} / {s['n']}")
        lines += [
            "",
            "| phase | tokens | n alone | GPU alone ms | n beside a send | GPU beside ms | since previous ms "
            "| profile ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in hyb["prefills"]:
            lines.append(
                f"| {r['phase']} | {r['tokens']} | {r['n_alone']} | {_f(r['alone_ms'])} | "
                f"{r['n_with_send']} | "
                f"{_f(r['with_send_ms'])} | {_f(r['since_previous_ms'])} | {_f(r['profile_ms'])} |"
            )
    return "\n".join(lines) if lines else "no colocated or hybrid events found"


def analyze(args: argparse.Namespace) -> int:
    from profiles.store import load_profile_dir

    profile = load_profile_dir("llada-8b", "h200-reference", "h200")
    result = analyze_logs(args.logs, profile)
    meta = dict(kv.split("=", 1) for kv in args.meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, **result}, indent=1, default=str))
    print(tables(result))
    return 0


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("plans", help="write the trace files the H200 call replays")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8, 16, 32, 64], help="B of batch-B<b>.csv")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens of the batch plans")
    p.add_argument("--output", type=int, default=192, help="output tokens of the batch plans")
    p.add_argument("--burst-prompts", type=_ints, default=[1024, 1792], help="prompt tokens of the burst")
    p.add_argument("--burst-each", type=int, default=8, help="burst requests per prompt length")
    p.add_argument("--hybrid-qps", type=float, default=1.0)
    p.add_argument("--hybrid-requests", type=int, default=20)
    p.add_argument("--hybrid-mask", type=int, default=256, help="the hybrid launcher's --max-gen-len")
    p.add_argument("--hybrid-prompt-cap", type=int, default=256, help="longer prompts are drawn again")
    p.add_argument("--seed", type=int, default=7)
    a = commands.add_parser("analyze", help="tables and a summary JSON from the shim's logs")
    a.add_argument("--logs", type=Path, required=True, help="folder of phases.jsonl, colocated/, hybrid/")
    a.add_argument("--json", type=Path)
    a.add_argument("--meta", nargs="*", default=[], help="KEY=VALUE pairs stored under meta")
    args = parser.parse_args(argv)
    try:
        return plans(args) if args.command == "plans" else analyze(args)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
