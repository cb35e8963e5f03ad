"""Synthetic trace statistics against the paper's Table 1 (20,000 samples, after the 4096 filter).

Run: python -m benchmarks.trace_stats [--seed S] [-n N]
"""

from __future__ import annotations

import argparse
import random
import statistics

from runs.args import positive_int
from runs.results import percentile
from sangam.workload import sample_lengths

TABLE_1 = {  # (median, p99, std) of prompt and output tokens
    "sharegpt": ((795, 2007, 596), (266, 874, 206)),
    "arxiv": ((2827, 3923, 890), (162, 360, 73)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=positive_int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'trace':>9} {'lengths':>7} {'stat':>6} {'ours':>8} {'paper':>6} {'error':>7}")
    for dataset, targets in TABLE_1.items():
        pairs = sample_lengths(dataset, args.n, random.Random(args.seed))
        columns = zip(*pairs, strict=True)
        for label, values, target in zip(("prompt", "output"), columns, targets, strict=True):
            ordered = sorted(values)
            ours = (percentile(ordered, 50), percentile(ordered, 99), statistics.pstdev(ordered))
            for stat, got, want in zip(("median", "p99", "std"), ours, target, strict=True):
                error = 100 * (got - want) / want
                print(f"{dataset:>9} {label:>7} {stat:>6} {got:>8.1f} {want:>6} {error:>+6.2f}%")


if __name__ == "__main__":
    main()
