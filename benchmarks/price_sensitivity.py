"""How much of a validation's error would go if decode-only iterations were priced higher: `sangam validate`
of shipped live runs with the testbed's decode-only prices scaled (issue 30: are the FP8 seed-14 misses the
underpriced graphed decodes of 5 or more items, or something else?). CPU only:

    python -m benchmarks.price_sensitivity --live-results DIR --seed S --qps Q [--testbed T]
        [--scale SMALL:LARGE ...]

Each `--scale a:b` multiplies the price of decode-only iterations of 1-4 items by a and of 5 or more by b
(1:1 is the testbed as it is), then prints the simulator's error in mean and p99 end-to-end latency against
the live run. Only stdout is written (each report goes to a temporary directory). It replaces
`MeasuredCostModel.seconds` for the run, which both builds allow (the class stays a Python class in the
native build); where it cannot be replaced, it stops with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

from cli.main import main as sangam
from profiles import measured
from runs.build import build
from sangam.batcher import Microbatch

LARGE = 5  # decodes from which a graphed replay was seen underpriced (iteration_fidelity)


def scaled_validate(args: argparse.Namespace, small: float, large: float) -> dict[str, float]:
    """The validate report's first point with decode-only prices scaled by (small, large)."""
    seconds = measured.MeasuredCostModel.seconds

    def scaled(self: measured.MeasuredCostModel, mb: Microbatch) -> float:
        price = seconds(self, mb)
        if mb.prefills:
            return price
        return price * (large if len(mb.decodes) >= LARGE else small)

    try:
        measured.MeasuredCostModel.seconds = scaled  # type: ignore[method-assign]
    except TypeError:  # a compiled (native) class has fixed methods
        raise SystemExit("price_sensitivity: this build's cost model cannot be re-priced") from None
    try:
        with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
            report = Path(out) / "report.json"
            code = sangam([
                "validate", "--mode", "colocated", "--model", args.model, "--gpu", args.gpu, "--gpus", "1",
                "--num-requests", str(args.num_requests), "--seed", str(args.seed), "--qps", f"{args.qps:g}",
                "--testbed", args.testbed, "--live-results", args.live_results, "--report", str(report),
            ])  # fmt: skip
            if code != 0:
                raise SystemExit(f"price_sensitivity: sangam validate exited {code}")
            point = json.loads(report.read_text())[0]
    finally:
        measured.MeasuredCostModel.seconds = seconds  # type: ignore[method-assign]
    live, sim = point["live"], point["sim"]
    return {
        key: 100 * (sim[f"{key}_e2el_ms"] - live[f"{key}_e2el_ms"]) / live[f"{key}_e2el_ms"]
        for key in ("mean", "p99")
    }


def scale(text: str) -> tuple[float, float]:
    """`a:b` -> (a, b), both positive (argparse turns the ValueError into a one-line usage error)."""
    small, large = (float(part) for part in text.split(":"))
    if small <= 0 or large <= 0:
        raise ValueError(text)
    return small, large


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="price_sensitivity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--live-results", required=True, help="a live run's directory, as for validate")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--qps", type=float, required=True)
    parser.add_argument("--num-requests", type=int, default=150)
    parser.add_argument("--model", default="llada-8b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--testbed", default="sangam-h200-fp8")
    parser.add_argument(
        "--scale",
        nargs="+",
        type=scale,
        default=[(1.0, 1.0), (1.05, 1.0), (1.0, 1.1), (1.05, 1.05)],
        metavar="SMALL:LARGE",
        help="price factors for decodes of 1-4 items and of 5 or more",
    )
    args = parser.parse_args(argv)
    print(
        f"# {args.live_results}, seed {args.seed}, {args.qps:g} QPS, testbed {args.testbed}, {build()} build"
    )
    print(f"{'1-4 decodes':>11} {'5+ decodes':>10} {'mean e2e':>9} {'p99 e2e':>8}  (simulator error)")
    for small, large in args.scale:
        errors = scaled_validate(args, small, large)
        print(f"{small:>10.2f}x {large:>9.2f}x {errors['mean']:>+8.1f}% {errors['p99']:>+7.1f}%", flush=True)


if __name__ == "__main__":
    main()
