"""The end-to-end gap between the reference's server and ours, per block and per forward, matched by request.

    python3 -m benchmarks.ref_gap --reference ref-qps0.5.json [--ours ours-qps0.5/blocks.csv] \
        [--reference-sim DIR/requests.csv] [--ours-sim DIR/requests.csv]

`--reference` is one replay-client JSON (`benchmarks/refpeer/replay_client.py`: each completed request's
server arrival and completion, and its forwards, all forced to `forwards_per_block` per block); the
optional `--ours` is `sangam live --out`'s `requests.csv` or `blocks.csv` of the same trace, and the
optional simulated runs are
`sangam sim --trace` over the same file, e.g. on the `reference-h200` testbed (the reference's iteration
times in our scheduler) and on `sangam-h200` (ours). For every pair of sides the table gives the summed
difference of end-to-end latency over the summed blocks, per block and per forward (a block's forwards
include its re-prefill), over all requests every side completed and over the requests that ran alone on
each live server given (no other request between their arrival and completion), where batching and
queueing are out of the difference.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path


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


def alone(served: dict[int, Served]) -> set[int]:
    """The requests no other request overlapped between their arrival and completion."""
    return {
        rid
        for rid, s in served.items()
        if all(o.end <= s.arrival or o.arrival >= s.end for other, o in served.items() if other != rid)
    }


LIVE = ("reference", "ours")
# live against live, each live side against its simulation, and the simulations against each other
PAIRS = (
    ("reference", "ours"),
    ("reference", "reference-sim"),
    ("ours", "ours-sim"),
    ("reference-sim", "ours-sim"),
)


def gap_rows(
    sides: dict[str, dict[int, Served]], per_block: int
) -> list[tuple[str, str, int, int, float, float]]:
    """(requests, pair, n, blocks, ms per block, ms per forward) for each of `PAIRS` given: all requests on
    every side, then those alone on every live server given (`LIVE`)."""
    common = set.intersection(*(set(s) for s in sides.values()))
    solo = set.intersection(common, *(alone(sides[live]) for live in LIVE if live in sides))
    pairs = [(a, b) for a, b in PAIRS if a in sides and b in sides]
    rows = []
    for label, ids in (("all", common), ("alone", solo)):
        blocks = sum(sides["reference"][rid].blocks for rid in ids)
        for a, b in pairs:
            diff = sum(sides[a][rid].e2e - sides[b][rid].e2e for rid in ids) * 1000
            per = diff / blocks if blocks else float("nan")
            rows.append((label, f"{a} - {b}", len(ids), blocks, per, per / per_block))
    return rows


def table(rows: list[tuple[str, str, int, int, float, float]]) -> str:
    lines = [
        "| requests | difference | n | blocks | ms per block | ms per forward |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {a} | {p} | {n} | {b} | {blk:.1f} | {fwd:.2f} |" for a, p, n, b, blk, fwd in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="a replay client's ref-qpsQ.json")
    parser.add_argument("--ours", type=Path, help="our live requests.csv or blocks.csv")
    parser.add_argument("--reference-sim", type=Path, help="requests.csv of a simulated reference")
    parser.add_argument("--ours-sim", type=Path, help="requests.csv of our simulated side")
    args = parser.parse_args(argv)
    try:
        reference, per_block = reference_requests(args.reference)
        sides = {"reference": reference}
        for name, path in (
            ("ours", args.ours),
            ("reference-sim", args.reference_sim),
            ("ours-sim", args.ours_sim),
        ):
            if path is not None:
                sides[name] = our_requests(path)
        for name, served in sides.items():
            if any(served[rid].blocks != reference[rid].blocks for rid in served.keys() & reference.keys()):
                raise ValueError(f"{name}: a request's blocks differ from the reference's (another trace?)")
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(gap_rows(sides, per_block)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
