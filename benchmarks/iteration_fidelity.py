"""Where the simulator's time goes wrong, iteration by iteration: a live run's log against the profile.

    python -m benchmarks.iteration_fidelity LIVE_DIR [LIVE_DIR ...] [--model M] [--gpu G] [--profile DIR]

For each live run directory (`sangam live --out DIR --iteration-log DIR/iterations.csv`), prints per
iteration kind (decode-only by batch size, prefill-only, mixed) the count, the mean live wall time
(`profiles.store.live_seconds`: host work included, to the next start where the loop went straight on),
the mean time of the worker's step (`Engine.step`, what a profile times: live less step is the worker
loop's own work between steps), the mean GPU time of the forward (step less GPU: the step's host work and
the sampler), and the profile's error on the live time (the GPU's profile, or the one in `--profile DIR`
under profiles/data, such as h200-fp8-kvfp8);
then, for decode-only iterations of 2 or more items, by item count: the mean of the GPU time minus the
profile's price and its correlation with the contexts' imbalance (items x the longest context - their
sum: an unsplit attention grid waits for the longest, which the graph buckets' own lines price);
then the forwards' GPU time against the price per 10-second window of the run (how fast this GPU ran
against the profile's: it differs from one loan of a machine to the next);
then the control plane's delay, from a block's end (or arrival) to its prefill starting on a worker that
was idle meanwhile (`runs.config.CONTROL_MS` is what the simulator charges).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from profiles.shapes import Shape
from profiles.store import Profile, live_seconds, load_profile, load_profile_dir


def kind(shape: Shape) -> str:
    if shape.prefills:
        return "mixed" if shape.decodes else "prefill"
    return f"decode x{min(len(shape.decodes), 5)}{'+' if len(shape.decodes) >= 5 else ''}"


Priced = list[tuple[dict[str, str], Shape, float]]  # a log's rows with their shapes and the profile's prices


def priced(rows: list[dict[str, str]], profile: Profile) -> Priced:
    shapes = [Shape.parse(row["items"]) for row in rows]
    return [(row, shape, profile.price(shape)) for row, shape in zip(rows, shapes, strict=True)]


def iterations(directory: Path, rows: Priced) -> None:
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for row, shape, price in rows:
        entry = sums[kind(shape)]
        entry[0] += 1
        entry[1] += live_seconds(row)
        entry[2] += float(row["end"]) - float(row["start"])
        entry[3] += float(row["gpu_s"])
        entry[4] += price
    print(f"{directory}: iterations")
    header = ("kind", "n", "live ms", "step ms", "GPU ms", "profile ms", "error", "time %")
    print("  {:<11} {:>6} {:>8} {:>7} {:>7} {:>10} {:>7} {:>6}".format(*header))
    total = sum(entry[1] for entry in sums.values())
    for name, (n, wall, step, gpu_s, predicted) in sorted(sums.items()):
        ms = [seconds / n * 1e3 for seconds in (wall, step, gpu_s, predicted)]
        means = "{:>8.2f} {:>7.2f} {:>7.2f} {:>10.2f}".format(*ms)
        error, share = 100 * (predicted - wall) / wall, 100 * wall / total
        print(f"  {name:<11} {n:>6.0f} {means} {error:>+6.1f}% {share:>6.1f}")


def imbalance(rows: Priced) -> None:
    by_items: dict[int, list[tuple[float, float]]] = defaultdict(list)  # (residual s, imbalance tokens)
    for row, shape, price in rows:
        if shape.prefills or len(shape.decodes) < 2:
            continue
        spread = len(shape.decodes) * max(shape.decodes) - sum(shape.decodes)
        by_items[len(shape.decodes)].append((float(row["gpu_s"]) - price, spread))
    for items, pairs in sorted(by_items.items()):
        residuals, spreads = zip(*pairs, strict=True)
        varied = len(pairs) > 2 and len(set(spreads)) > 1 and len(set(residuals)) > 1
        correlation = f"{statistics.correlation(residuals, spreads):+.2f}" if varied else "-"
        over, spread = statistics.mean(residuals) * 1e3, statistics.mean(spreads)
        print(
            f"  {items} decodes: {len(pairs)} iterations, GPU over profile {over:+.2f} ms, correlation with "
            f"imbalance {correlation} (mean imbalance {spread:.0f} tokens)"
        )


WINDOW_S = 10.0


def drift(rows: Priced) -> None:
    windows: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])  # (GPU s, price s)
    for row, _, price in rows:
        window = windows[int(float(row["start"]) // WINDOW_S)]
        window[0] += float(row["gpu_s"])
        window[1] += price
    ratios = " ".join(f"{100 * (gpu / price - 1):+.0f}" for _, (gpu, price) in sorted(windows.items()))
    print(f"  GPU time against the price, % per {WINDOW_S:g} s window: {ratios}")


def control_delays(directory: Path, rows: list[dict[str, str]]) -> None:
    starts = sorted(float(row["start"]) for row in rows)
    delays: dict[str, list[float]] = defaultdict(list)
    with (directory / "blocks.csv").open(newline="") as f:
        for block in csv.DictReader(f):
            ready, start = float(block["ready"]), float(block["prefill_start"])
            if bisect.bisect_left(starts, start - 1e-6) <= bisect.bisect_right(starts, ready + 1e-6):
                delays["arrival" if block["block"] == "0" else "re-prefill"].append(start - ready)
    for name, values in sorted(delays.items()):
        print(
            f"  control delay, {name} on an idle worker: median {statistics.median(values) * 1e3:.2f} ms "
            f"over {len(values)} blocks"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="live run directories")
    parser.add_argument("--model", default="llada-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--profile", metavar="DIR", help="a profile directory under profiles/data")
    args = parser.parse_args(argv)
    if args.profile:
        profile = load_profile_dir(args.model, args.profile, args.gpu)
    else:
        profile = load_profile(args.model, args.gpu)
    where = f" in profiles/data/{args.profile}" if args.profile else ""
    if profile is None:
        raise SystemExit(f"iteration_fidelity: no profile of {args.model} on {args.gpu}{where}")
    for directory in args.runs:
        try:
            with (directory / "iterations.csv").open(newline="") as f:
                rows = priced(list(csv.DictReader(f)), profile)
            iterations(directory, rows)
            imbalance(rows)
            drift(rows)
            control_delays(directory, [row for row, _, _ in rows])
        except KeyError as err:
            raise SystemExit(f"iteration_fidelity: {directory}: a log lacks the column {err}") from None
        except (OSError, ValueError) as err:  # a missing file, a malformed row
            raise SystemExit(f"iteration_fidelity: {directory}: {err}") from None


if __name__ == "__main__":
    main()
