"""The reference implementation's worker loop and KV handoff as testbed terms, each derived from what was
measured (docs/calibration.md, "The reference's loops, read and measured"):

- its report per iteration (`report_ms`, `report_token_ns`): the synchronous `ReportBatchMetrics` that
  carries every request's full sequence, timed per batch size and sequence length on the H200 host
  (`report-rpc.json` of `benchmarks/h200_ref_replay.sh`), fitted as a + c * tokens by relative least
  squares;
- the rest of its loop per iteration (`other_ms` plus `other_item_ms` per item): its colocated worker's
  decode-only iterations through its own server on one H200 (`benchmarks/h200_ref_loops.sh`, B = 1-64
  requests at once), the wall time from one iteration's start to the next less its GPU call and less the
  report fit, fitted as a + b * items by relative least squares over the medians per batch size;
- per dispatch (`control_ms`): a lone request's block end to its next prefill on the same server, less
  the loop's cost of that last iteration (the simulator charges the loop before the block ends);
- per transfer (`handoff_ms`): from a prefill batch's end to its KV send's start through its hybrid
  launcher (one prefill and one decode worker on the same H200).

The H200 replay of its server (`benchmarks/h200_ref_replay.sh`: 0.5 and 1.5 QPS) is held out: the command
prints the simulator's end-to-end figures on the new testbed against it when the testbed is an H200's.

    python -m calib.reference_loop --testbed reference-h100 --name my-reference-h100 --out DIR

writes the base testbed with those terms and its version raised by one; `--check` compares them with
the testbed's own instead (exit 1 where they differ).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiles.testbed import LoopEntry, Sourced, Testbed
from profiles.testbeds import load_testbed, new_testbed_file, write_testbed
from runs.build import ROOT, shown
from runs.config import RunConfig, load_progress, workload_points
from runs.results import percentile
from sangam.cost import IterationKind
from sim.run import simulate
from sim.setup import Resolver

RESULTS = ROOT / "benchmarks" / "results"
REPLAY = RESULTS / "ref-replay-h200"
LOOPS = RESULTS / "ref-loops-h200"
# the colocated sweep's sequence (benchmarks/ref_loops.py plans' prompt, the launcher's --max-gen-len): the
# reference's report carries each request's prompt and its whole mask buffer, as the simulator's seq_len
LOOPS_SEQ = 256 + 512
SCALED = "llada-8b"  # the model the loops were measured with
MIN_ITERATIONS = 5  # loop points of fewer iterations (stragglers between batch sizes) are left out
# the replay as benchmarks/h200_ref_replay.sh ran it: trace seed, KV pages, mask buffer
REPLAY_SEED, REPLAY_PAGES, REPLAY_MASK = 7, 8192, 512


@dataclass(frozen=True)
class Served:
    """One request's time on one server: arrival and completion (s, the server's clock) and its blocks."""

    arrival: float
    end: float
    blocks: int

    @property
    def e2e(self) -> float:
        return self.end - self.arrival


def reference_requests(path: Path) -> tuple[dict[int, Served], int]:
    """The completed requests of a replay-client JSON by trace id, and its forwards per block."""
    data = json.loads(path.read_text())
    per_block = int(data["forwards_per_block"])
    served = {
        int(r["id"]): Served(r["server_arrival"], r["server_complete"], int(r["forwards"]) // per_block)
        for r in data["rows"]
        if r.get("status") == "COMPLETED"
    }
    return served, per_block


def our_requests(path: Path) -> dict[int, Served]:
    """The requests of a `requests.csv` (sim or live) or of a live `blocks.csv` (first block ready to last
    block end) by request id."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "e2el" in rows[0]:
        return {
            int(r["request_id"]): Served(float(r["arrival"]), float(r["end"]), int(r["n_blocks"]))
            for r in rows
        }
    blocks: dict[int, list[dict[str, str]]] = {}
    for r in rows:
        blocks.setdefault(int(r["request_id"]), []).append(r)
    return {
        rid: Served(
            min(float(b["ready"]) for b in bs),
            max(float(b["end"]) for b in bs),
            len({b["block"] for b in bs}),
        )
        for rid, bs in blocks.items()
    }


def served_from_requests(requests: Sequence[Any]) -> dict[int, Served]:
    """Simulated requests (`sangam.request.Request`) as `Served`."""
    return {r.id: Served(r.arrival, r.blocks[-1].end, r.n_blocks) for r in requests if r.finished}


def alone(served: Mapping[int, Served]) -> set[int]:
    """The requests no other request overlapped between their arrival and completion."""
    return {
        rid
        for rid, s in served.items()
        if all(o.end <= s.arrival or o.arrival >= s.end for other, o in served.items() if other != rid)
    }


def relative_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(a, b) of a + b * x through the points by least squares of the relative error (each point weighs
    alike)."""
    if len(set(xs)) < 2 or any(y <= 0 for y in ys):
        raise ValueError(f"a line needs two distinct x and positive y, got {len(ys)} points")
    # normal equations of sum(((a + b * x) / y - 1) ** 2)
    s11 = sum(1 / y**2 for y in ys)
    s12 = sum(x / y**2 for x, y in zip(xs, ys, strict=True))
    s22 = sum(x**2 / y**2 for x, y in zip(xs, ys, strict=True))
    b1 = sum(1 / y for y in ys)
    b2 = sum(x / y for x, y in zip(xs, ys, strict=True))
    det = s11 * s22 - s12**2
    return (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det


def report_fit(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """(ms, ns per token): a + c * B * L through the report timer's medians `total_ms`, by least squares
    of the relative error (every batch size weighs alike)."""
    a, c = relative_line(
        [float(r["batch_size"] * r["seq_len"]) for r in rows], [float(r["total_ms"]) for r in rows]
    )
    return a, c * 1e6


def replay_errors(testbed: Testbed, replay: Path = REPLAY) -> dict[str, dict[str, float]]:
    """Per load of the H200 replay (the reference's own server, LLaDA-8B, 8 forwards per block): its mean,
    median and p99 end-to-end seconds over its completed requests, and the simulator's on `testbed` for the
    same trace and pages (a check held out from every term: none is derived from these runs)."""
    out = {}
    for path in sorted(replay.glob("ref-qps*.json")):
        load = path.stem.removeprefix("ref-")
        reference, per_block = reference_requests(path)
        base = RunConfig(
            mode="1C",
            model="llada-8b",
            trace=str(replay / "traces" / f"trace-{load}.csv"),
            seed=REPLAY_SEED,
            pages=REPLAY_PAGES,
            mask_len=REPLAY_MASK,
        )
        progress = f"fixed:{per_block}"
        setup = Resolver(testbed).resolve(base, {"pages": base.pages}, progress)
        ((cfg, rows),) = workload_points(setup.config, [setup.config.qps])
        result = simulate(
            cfg,
            rows,
            setup.cost,
            progress=load_progress(progress),
            link=setup.options.link_spec(),
            control_s=setup.options.control_ms / 1000,
        )
        simulated = served_from_requests(result.requests)
        ids = sorted(reference.keys() & simulated.keys())
        live = [reference[i].e2e for i in ids]
        sim = [simulated[i].e2e for i in ids]
        out[load] = {
            "requests": len(ids),
            **{f"live_{k}": f(live) for k, f in SUMMARIES.items()},
            **{f"sim_{k}": f(sim) for k, f in SUMMARIES.items()},
        }
    return out


SUMMARIES: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "p99": lambda xs: percentile(sorted(xs), 99),  # as the simulator's summaries
}


@dataclass(frozen=True)
class Terms:
    """What `calib.reference_loop` derives: the worker loop, the KV handoff and the control delay."""

    loop: LoopEntry
    handoff_ms: Sourced
    control_ms: Sourced
    scales: Mapping[IterationKind, Sourced]  # LLaDA-8B's GPU call in its own loop over its peer profile


def rest_fit(points: Sequence[Mapping[str, Any]], report: tuple[float, float]) -> tuple[float, float]:
    """(ms, ms per item): what the colocated sweep's decode-only iterations spent beyond their GPU call and
    the report fit (`report`: ms, ns per token, at the sweep's sequence), as a + b * items by least squares
    of the relative error, over the points of at least `MIN_ITERATIONS` iterations."""
    a_r, c_r = report
    kept = [p for p in points if p["n"] >= MIN_ITERATIONS]
    xs = [float(p["decodes"]) for p in kept]
    ys = [p["beyond_gpu"] - a_r - c_r * p["decodes"] * LOOPS_SEQ / 1e6 for p in kept]
    return relative_line(xs, ys)


def control_term(gaps: Mapping[str, Mapping[str, Any]], loop: LoopEntry, where: Path | str) -> Sourced:
    """The control delay: a lone request's block end (its last forward's GPU call) to its next prefill's GPU
    call, less the loop's cost of that last iteration (the simulator charges it before the block ends)."""
    alone = {name: g["gap"]["median"] for name, g in gaps.items() if name.startswith("batch-B1-")}
    if not alone:
        raise ValueError(f"{where}: no lone-request phase (batch-B1-D*) in block_gaps_by_phase")
    costs = loop.costs()
    loop_ms = (costs.iteration_s + costs.item_s + costs.token_s * LOOPS_SEQ) * 1e3
    gap = statistics.fmean(alone.values())
    phases = ", ".join(f"{n} {v:.2f} ms" for n, v in sorted(alone.items()))
    return Sourced(
        gap - loop_ms,
        f"a lone request's block end to its next prefill through the reference's colocated server on one "
        f"H200 (median per phase: {phases}; {where}) less the loop above for that last iteration "
        f"({loop_ms:.2f} ms); calib/reference_loop.py",
    )


def loop_terms(replay: Path = REPLAY, loops: Path = LOOPS) -> Terms:
    """The loop's terms, the handoff and the control delay, from the measurement files: host costs, the same
    on every testbed of the reference's executor."""
    rpc = replay / "report-rpc.json"
    rows = json.loads(rpc.read_text())["rows"]
    a, c = report_fit(rows)
    fit = (
        f"the reference's per-iteration ReportBatchMetrics (Batch build, to_proto, blocking call; every "
        f"request's full sequence) on the H200 host, relative least squares a + c * tokens through its "
        f"{len(rows)} medians (B = 1-64, L = 1024 and 1536; {shown(rpc)}, "
        f"benchmarks/refpeer/report_rpc_timer.py); calib/reference_loop.py"
    )
    colocated_file = loops / "colocated" / "summary.json"
    colocated = json.loads(colocated_file.read_text())["colocated"]
    rest_a, rest_b = rest_fit(colocated["loop_points"], (a, c))
    rest = (
        f"the reference's colocated worker on one H200 (benchmarks/h200_ref_loops.sh, its own server with a "
        f"timing shim; B = 1-64 requests in decode at 8 and 16 forwards per block, {LOOPS_SEQ}-token "
        f"sequences): per decode-only iteration the wall time from its start to the next one's less its GPU "
        f"call, less the report fit above, medians per batch size, relative least squares a + b * items "
        f"({shown(colocated_file)}); calib/reference_loop.py"
    )
    loop = LoopEntry(Sourced(a, fit), Sourced(c, fit), Sourced(rest_a, rest), Sourced(rest_b, rest))
    control = control_term(colocated["block_gaps_by_phase"], loop, shown(colocated_file))
    hybrid_file = loops / "hybrid" / "summary.json"
    path = json.loads(hybrid_file.read_text())["hybrid"]["transfers"]["prefill_end_to_send_ms"]
    handoff = Sourced(
        path["median"],
        f"from a prefill batch's end (its report sent) to its KV send's start, through the reference's "
        f"hybrid launcher (one prefill and one decode worker on one H200, 1 QPS; median of {path['n']} "
        f"transfers; {shown(hybrid_file)}): its scheduler's report handling, its blocking TriggerKVTransfer "
        f"and the prefill worker's transfer thread starting the send; calib/reference_loop.py",
    )
    return Terms(loop, handoff, control, loop_scales(colocated, hybrid_file, shown(colocated_file)))


def loop_scales(colocated: Mapping[str, Any], hybrid_file: Path, where: Path) -> dict[IterationKind, Sourced]:
    """LLaDA-8B's GPU call inside the reference's own loops over what its peer profile timed for the same
    microbatch, median per iteration kind: decode and mixed from its colocated worker, prefill from its
    prefill worker's back-to-back burst (the prefill-only iterations that matter: a prefill-role worker's)."""
    burst = json.loads(hybrid_file.read_text())["hybrid"]["burst_gpu_over_profile"]["prefill"]
    measured = {
        IterationKind.DECODE: (colocated["gpu_over_profile"]["decode"], f"its colocated worker ({where})"),
        IterationKind.MIXED: (colocated["gpu_over_profile"]["mixed"], f"its colocated worker ({where})"),
        IterationKind.PREFILL: (
            burst,
            f"its hybrid launcher's prefill worker, a burst ({shown(hybrid_file)})",
        ),
    }
    return {
        kind: Sourced(
            ratio["median"],
            f"LLaDA-8B's GPU call inside the reference's own loop on one H200 over its peer profile's time "
            f"for the same microbatch (h200-reference), median of {ratio['n']} {kind.value} iterations of "
            f"{what}; "
            f"benchmarks/h200_ref_loops.sh, calib/reference_loop.py",
        )
        for kind, (ratio, what) in measured.items()
    }


def with_terms(base: Testbed, name: str, terms: Terms) -> Testbed:
    note = (
        f" Version {base.version + 1}: the reference's worker loop (its report and the rest of its loop, per "
        f"iteration and per item), its KV handoff, its own control delay and LLaDA-8B's GPU call inside its "
        f"loops over the profile, measured through its own servers on one H200 "
        f"(benchmarks/h200_ref_loops.sh) and derived by calib/reference_loop.py."
    )
    return dataclasses.replace(
        base,
        name=name,
        version=base.version + 1,
        description=base.description + note,
        loop=terms.loop,
        handoff_ms=terms.handoff_ms,
        control_ms=terms.control_ms,
        time_scales={**base.time_scales, SCALED: terms.scales},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", default="reference-h200", help="the base testbed (a name or file)")
    parser.add_argument("--name", help="the new testbed's name (default: the base's plus -loop)")
    parser.add_argument("--out", type=Path, help="a directory or NAME.json (default: the working directory)")
    parser.add_argument("--replay", type=Path, default=REPLAY, help="h200_ref_replay.sh's results")
    parser.add_argument("--loops", type=Path, default=LOOPS, help="h200_ref_loops.sh's results")
    parser.add_argument("--check", action="store_true", help="compare with the testbed's own terms")
    args = parser.parse_args(argv)
    try:
        base = load_testbed(args.testbed)
        terms = loop_terms(args.replay, args.loops)
        if args.check:
            same = (base.loop, base.handoff_ms, base.control_ms, base.time_scales.get(SCALED)) == (
                terms.loop,
                terms.handoff_ms,
                terms.control_ms,
                terms.scales,
            )
            print(
                f"{base.name}: its loop, handoff, control delay and {SCALED} time scales are"
                f"{'' if same else ' NOT'} the measured ones"
            )
            return 0 if same else 1
        named_by_file = args.out is not None and args.out.suffix == ".json"
        name = args.name or (None if named_by_file else f"{base.name}-loop")
        name, path = new_testbed_file(name, args.out, base.name)
        made = with_terms(base, name, terms)
        write_testbed(made, path)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    loop = terms.loop
    print(
        f"{path}: per iteration {loop.report_ms.value:.3f} ms + {loop.report_token_ns.value:.2f} ns per "
        f"token (report) + {loop.other_ms.value:.3f} ms + {loop.other_item_ms.value:.3f} ms per item; "
        f"handoff {terms.handoff_ms.value:.2f} ms per transfer; control delay {terms.control_ms.value:.2f} ms"
    )
    if made.gpu == "h200":
        for load, e in replay_errors(made, args.replay).items():
            print(
                f"held out, the reference's H200 replay at {load} ({e['requests']} requests): end to end "
                + ", ".join(
                    f"{k} {e[f'sim_{k}']:.3f} s against {e[f'live_{k}']:.3f} s "
                    f"({e[f'sim_{k}'] / e[f'live_{k}'] - 1:+.0%})"
                    for k in SUMMARIES
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
