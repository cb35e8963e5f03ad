"""`sangam fit`: fit a testbed's forwards per block (and time scales per iteration kind) to observed
load-curve points (or measure forwards per block, or the worker loop, from live runs) and write it as a new
testbed."""

from __future__ import annotations

import argparse
from typing import Any

from runs.config import RunConfig
from runs.options import add_options, collect


def add_parser(commands: Any, name: str) -> None:
    from calib.fit import FitOptions
    from sim.options import SimOptions

    parser = commands.add_parser(
        name,
        help="fit a testbed's forwards per block (and time scales) to observed curves, or to live "
        "blocks; write it",
    )
    add_options(parser, FitOptions)
    add_options(parser, SimOptions, only=("testbed",), default_text={"testbed": "sangam-h100"})
    add_options(
        parser, RunConfig, only=("num_requests", "seed"), defaults={"num_requests": 1000},
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from calib.fit import FitOptions, fit_targets, fitted_testbed, measured_testbed, profiled_testbed
    from calib.targets import read_targets
    from calib.worker_loop import looped_testbed
    from profiles.store import DATA
    from profiles.testbeds import choose_testbed, new_testbed_file, write_testbed

    options = collect(FitOptions, args)
    blocks, loops = list(options.blocks), list(options.loop)
    if [options.targets is not None, bool(blocks), bool(loops), options.profile is not None].count(True) != 1:
        raise ValueError("give one of --targets CSV, --blocks DIR..., --loop DIR... or --profile DIR")
    base = choose_testbed(args.testbed, None)
    name, out = new_testbed_file(options.name, options.out, base.name)
    if options.profile is not None:
        testbed = profiled_testbed(base, name, options.profile, DATA)
        print(testbed.kv_pages.source)
    elif loops:
        testbed = looped_testbed(base, name, loops, DATA)
        assert testbed.loop is not None
        print(f"worker loop: {testbed.loop.costs().label().removeprefix('plus a loop of ')}")
    elif blocks:
        testbed = measured_testbed(base, name, blocks)
        for (model, trace), entry in testbed.progress.items():
            if entry.spec.startswith("counts:"):
                print(f"{model} {trace}: {entry.spec}")
    else:
        assert options.targets is not None
        targets = read_targets(options.targets)
        fits = fit_targets(base, targets, options.free, args.num_requests, args.seed, options.kinds)
        print_fits(fits)
        testbed = fitted_testbed(
            base, name, fits, options.targets, options.free, args.num_requests, args.seed
        )
    write_testbed(testbed, out)
    print(f"wrote testbed {name} to {out}")
    return 0


def print_fits(fits: list[Any]) -> None:
    from calib.fit import spread

    for fit in fits:
        lines = []
        for pair in fit.pairs:
            if pair.mean is None:
                lines.append(f"{pair.model} {pair.trace}: forwards per block kept ({pair.spec})")
            else:
                std = spread(pair.mean, pair.rho)
                lines.append(
                    f"{pair.model} {pair.trace}: forwards per block mean {pair.mean:.2f}, std {std:.2f}"
                    f" ({pair.spec})"
                )
        if fit.kinds:
            scales = ", ".join(f"{kind.value} {fit.scales.of(kind):.3f}" for kind in fit.kinds)
            lines.append(f"{fit.model}: time scale per iteration kind {scales}")
        lines[-1] += f"; objective {fit.objective:.4f} after {fit.evaluations} simulations"
        print("\n".join(lines))
        print(f"  {'point':58} {'observed':>9} {'fitted':>9} {'ratio':>6} {'held out':>9} {'ratio':>6}")
        for p in fit.points:
            held = (
                f"{p.held_out:9.3f} {p.held_out / p.target.value:6.3f}"
                if p.held_out is not None
                else f"{'-':>9} {'-':>6}"
            )
            print(
                f"  {p.target.label():58} {p.target.value:9.3f} {p.simulated:9.3f} "
                f"{p.simulated / p.target.value:6.3f} {held}"
            )
