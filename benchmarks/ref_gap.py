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
import sys
from pathlib import Path

from calib.reference_loop import Served, alone, our_requests, reference_requests

__all__ = ["Served", "alone", "gap_rows", "main"]


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
