"""The reference implementation's worker loop and KV handoff as testbed terms, each derived from what was
measured (docs/calibration.md, "The reference's loops, read and measured"):

- its report per iteration (`report_ms`, `report_token_ns`): the synchronous `ReportBatchMetrics` that
  carries every request's full sequence, timed per batch size and sequence length on the H200 host
  (`report-rpc.json` of `benchmarks/h200_ref_replay.sh`), fitted as a + c * tokens by relative least
  squares;
- the rest of its loop per iteration (`other_ms`): what its server spent beyond its iteration times and
  that report, over the requests that ran alone on both live servers of the same replay
  (`ref-qps0.5.json`, our `blocks.csv`): the simulator replays the trace on `reference-h200` with the
  report term, and the summed end-to-end difference over the summed forwards is the term (each forward
  of a request alone is one iteration);
- per transfer (`handoff_ms`) and per dispatch (`control_ms`): from a prefill's end to its KV send's start,
  and from a block's end to its next prefill on a worker, through the reference's real scheduler
  (`benchmarks/refpeer/sched_loop.py` at 1 QPS on a CPU machine), in the H200 host's time: scaled by a
  one-request report's time there over the H200 host's.

    python -m calib.reference_loop --testbed reference-h100 --name my-reference-h100 --out DIR

writes the base testbed with those terms and its version raised by one; `--check` compares them with
the testbed's own instead (exit 1 where they differ).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiles.testbed import LoopEntry, Sourced, Testbed
from profiles.testbeds import load_testbed, new_testbed_file, write_testbed
from runs.build import ROOT
from runs.config import RunConfig, load_progress, workload_points
from sim.run import simulate
from sim.setup import Resolver

RESULTS = ROOT / "benchmarks" / "results"
REPLAY = RESULTS / "ref-replay-h200"
SCHED = RESULTS / "ref-sched-loop-cpu"
# the replay's 0.5 QPS load as benchmarks/h200_ref_replay.sh ran it: trace seed, KV pages, mask buffer
REPLAY_LOAD, REPLAY_SEED, REPLAY_PAGES, REPLAY_MASK = "qps0.5", 7, 8192, 512
REPLAY_TESTBED = "reference-h200"  # the replay's GPU and the reference's iteration times on it
LOW_LOAD = "5P3D-qps1"  # sched_loop's run where its own processes do not queue on this machine


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


def report_fit(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """(ms, ns per token): a + c * B * L through the report timer's medians `total_ms`, by least squares
    of the relative error (every batch size weighs alike)."""
    xs = [(1.0, float(r["batch_size"] * r["seq_len"])) for r in rows]
    ys = [float(r["total_ms"]) for r in rows]
    # normal equations of sum(((a + c * x) / y - 1) ** 2)
    s11 = sum(1 / y**2 for y in ys)
    s12 = sum(x / y**2 for (_, x), y in zip(xs, ys, strict=True))
    s22 = sum(x**2 / y**2 for (_, x), y in zip(xs, ys, strict=True))
    b1 = sum(1 / y for y in ys)
    b2 = sum(x / y for (_, x), y in zip(xs, ys, strict=True))
    det = s11 * s22 - s12**2
    a = (b1 * s22 - b2 * s12) / det
    c = (s11 * b2 - s12 * b1) / det
    return a, c * 1e6


def forward_residual_ms(testbed: Testbed, replay: Path) -> tuple[float, int, int]:
    """(ms per forward, requests, forwards): the reference's end-to-end time beyond the simulator's on
    `testbed`, over the requests alone on both live servers of the replay at 0.5 QPS."""
    reference, per_block = reference_requests(replay / f"ref-{REPLAY_LOAD}.json")
    ours = our_requests(replay / f"ours-{REPLAY_LOAD}" / "blocks.csv")
    base = RunConfig(
        mode="1C",
        model="llada-8b",
        trace=str(replay / "traces" / f"trace-{REPLAY_LOAD}.csv"),
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
    ids = alone(reference) & alone(ours) & simulated.keys()
    if any(simulated[rid].blocks != reference[rid].blocks for rid in ids):
        raise ValueError(f"{replay}: the simulated blocks differ from the reference's (another trace?)")
    forwards = per_block * sum(reference[rid].blocks for rid in ids)
    gap = sum(reference[rid].e2e - simulated[rid].e2e for rid in ids)
    return gap * 1000 / forwards, len(ids), forwards


@dataclass(frozen=True)
class Terms:
    """What `calib.reference_loop` derives: the worker loop, the KV handoff and the control delay."""

    loop: LoopEntry
    handoff_ms: Sourced
    control_ms: Sourced


def host_path_ms(sched: Path, report_rows: Sequence[Mapping[str, Any]], path: str, what: str) -> Sourced:
    """A control-plane path of the reference's (a key of sched_loop's `per_block_ms`), its median at low load
    in the H200 host's time: scaled by a prefill worker's one-request report there over the same report's
    time on the H200 host (the report timer's fit at the run's mean sequence)."""
    summary = json.loads((sched / LOW_LOAD / "summary.json").read_text())
    here = summary["per_block_ms"][path]["median"]
    rpc_here = summary["per_block_ms"]["prefill_report_rpc"]["median"]
    seq = summary["meta"]["mean_seq_len"]
    a, c = report_fit(report_rows)
    rpc_host = a + c * seq / 1e6
    value = here * rpc_host / rpc_here
    source = (
        f"{what} through the reference's real scheduler (HybridScheduler, 5P3D, fake workers; "
        f"benchmarks/refpeer/sched_loop.py) at 1 QPS on a loaded 2-core CPU machine "
        f"(benchmarks/results/ref-sched-loop-cpu/{LOW_LOAD}): median {here:.2f} ms there, where a prefill "
        f"worker's one-request report took {rpc_here:.2f} ms against {rpc_host:.2f} ms on the H200 host "
        f"(report-rpc.json at the run's {seq:.0f}-token mean sequence): {value:.2f} ms in the H200 host's "
        f"time; calib/reference_loop.py"
    )
    return Sourced(value, source)


def loop_terms(replay: Path = REPLAY, sched: Path = SCHED) -> Terms:
    """The loop's terms, the handoff and the control delay, from the measurement files: host costs, the same
    on every testbed of the reference's executor (the loop's rest is what the H200 replay leaves beyond
    `REPLAY_TESTBED`'s H200 profile, its report and its control delay)."""
    rpc = replay / "report-rpc.json"
    rows = json.loads(rpc.read_text())["rows"]
    a, c = report_fit(rows)
    where = rpc.relative_to(ROOT) if rpc.is_relative_to(ROOT) else rpc
    fit = (
        f"the reference's per-iteration ReportBatchMetrics (Batch build, to_proto, blocking call; every "
        f"request's full sequence) on the H200 host, relative least squares a + c * tokens through its "
        f"{len(rows)} medians (B = 1-64, L = 1024 and 1536; {where}, "
        f"benchmarks/refpeer/report_rpc_timer.py); calib/reference_loop.py"
    )
    report, token = Sourced(a, fit), Sourced(c, fit)
    handoff = host_path_ms(
        sched, rows, "prefill_end_to_kv_send", "from a prefill's end to its KV send's start"
    )
    control = host_path_ms(
        sched,
        rows,
        "block_end_to_next_prefill_enqueued",
        "from a block's end to its next prefill on a worker",
    )
    h200 = dataclasses.replace(
        load_testbed(REPLAY_TESTBED), loop=LoopEntry(report, token, Sourced(0.0, "none")), control_ms=control
    )
    per_forward, n, forwards = forward_residual_ms(h200, replay)
    other = Sourced(
        per_forward,
        f"the reference's server (h200_ref_replay.sh: LLaDA-8B, 8 forwards per block, 0.5 QPS) against "
        f"its H200 profile ({h200.profile_dir('llada-8b')}) with the report term and control delay above, "
        f"simulated on the same trace and pages: the end-to-end difference over the {n} requests alone on "
        f"both live servers ({forwards} forwards, each one iteration) per forward; charged per iteration "
        f"whatever its batch (how it grows with the batch is not measured); calib/reference_loop.py",
    )
    return Terms(LoopEntry(report, token, other), handoff, control)


def with_terms(base: Testbed, name: str, terms: Terms) -> Testbed:
    note = (
        f" Version {base.version + 1}: plus the reference's worker loop (its report and the rest of its loop "
        f"per iteration), its KV handoff and its own control delay, derived by calib/reference_loop.py."
    )
    return dataclasses.replace(
        base,
        name=name,
        version=base.version + 1,
        description=base.description + note,
        loop=terms.loop,
        handoff_ms=terms.handoff_ms,
        control_ms=terms.control_ms,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", default="reference-h200", help="the base testbed (a name or file)")
    parser.add_argument("--name", help="the new testbed's name (default: the base's plus -loop)")
    parser.add_argument("--out", type=Path, help="a directory or NAME.json (default: the working directory)")
    parser.add_argument("--replay", type=Path, default=REPLAY, help="h200_ref_replay.sh's results")
    parser.add_argument(
        "--sched", type=Path, default=SCHED, help="benchmarks/refpeer/sched_loop.py's results"
    )
    parser.add_argument("--check", action="store_true", help="compare with the testbed's own terms")
    args = parser.parse_args(argv)
    try:
        base = load_testbed(args.testbed)
        terms = loop_terms(args.replay, args.sched)
        if args.check:
            same = (base.loop, base.handoff_ms, base.control_ms) == (
                terms.loop,
                terms.handoff_ms,
                terms.control_ms,
            )
            print(
                f"{base.name}: its loop, handoff and control delay are"
                f"{'' if same else ' NOT'} the measured ones"
            )
            return 0 if same else 1
        named_by_file = args.out is not None and args.out.suffix == ".json"
        name = args.name or (None if named_by_file else f"{base.name}-loop")
        name, path = new_testbed_file(name, args.out, base.name)
        write_testbed(with_terms(base, name, terms), path)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    loop = terms.loop
    print(
        f"{path}: per iteration {loop.report_ms.value:.3f} ms + {loop.report_token_ns.value:.2f} ns per "
        f"token (report) + {loop.other_ms.value:.3f} ms; handoff {terms.handoff_ms.value:.2f} ms per "
        f"transfer; control delay {terms.control_ms.value:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
