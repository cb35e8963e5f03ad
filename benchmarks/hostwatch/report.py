"""Host launch time against GPU time per iteration kind, from a live run watched by `hostwatch`.

    python -m benchmarks.hostwatch.report ITERATIONS_CSV HOST_CSV [--profile DIR]

Pairs the i-th step of the worker's host log (`sitecustomize.py` here) with the i-th row of the run's
iteration log (one worker: both in order), then prints per kind (decode, mixed, prefill) the medians of the
host time to launch the forward, of the forward's GPU time and of their ratio, and for iterations over 1.3
times their profile price (`--profile`, under profiles/data) how close launch and GPU time were; and the
garbage collections' count and total time.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from profiles.shapes import Shape
from profiles.store import load_profile_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("iterations", type=Path)
    parser.add_argument("host", type=Path)
    parser.add_argument("--profile", default="h200-fp8-kvfp8")
    parser.add_argument("--model", default="llada-8b")
    args = parser.parse_args(argv)
    profile = load_profile_dir(args.model, args.profile, "h200")
    if profile is None:
        raise SystemExit(f"hostwatch.report: no profile of {args.model} in profiles/data/{args.profile}")
    try:
        with args.iterations.open(newline="") as f:
            rows = list(csv.DictReader(f))
        with args.host.open(newline="") as f:
            host = list(csv.DictReader(f))
    except OSError as err:
        raise SystemExit(f"hostwatch.report: {err}") from None
    try:
        steps = [r for r in host if r["kind"] == "step"]
        collections = [float(r["a"]) for r in host if r["kind"] == "gc"]
        if len(steps) != len(rows):
            raise SystemExit(f"hostwatch.report: {len(steps)} host steps against {len(rows)} iterations")
        kinds: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for row, step in zip(rows, steps, strict=True):
            shape = Shape.parse(row["items"])
            kind = ("mixed" if shape.decodes else "prefill") if shape.prefills else "decode"
            gpu = float(row["gpu_s"])
            kinds[kind].append((float(step["a"]), gpu, gpu / profile.price(shape)))
    except (KeyError, ValueError) as err:  # a missing column, a malformed row
        raise SystemExit(f"hostwatch.report: a bad log: {err!r}") from None
    print(
        f"{len(rows)} iterations; {len(collections)} garbage collections, "
        f"{sum(collections) * 1e3:.0f} ms in all"
    )
    for kind, values in sorted(kinds.items()):
        launch = statistics.median(v[0] for v in values) * 1e3
        gpu = statistics.median(v[1] for v in values) * 1e3
        ratio = statistics.median(v[0] / v[1] for v in values)
        slow = [v for v in values if v[2] > 1.3]
        close = sum(v[0] > 0.9 * v[1] for v in slow)
        print(
            f"  {kind:<8} {len(values):>5}: launch {launch:6.2f} ms, GPU {gpu:6.2f} ms "
            f"(median launch/GPU {ratio:.2f}); "
            f"{len(slow)} over 1.3x their price, {close} of them launched in over 90% of their GPU time"
        )


if __name__ == "__main__":
    main()
