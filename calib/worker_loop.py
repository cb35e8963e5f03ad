"""Our worker loop's own time between steps, measured in live runs' iteration logs, as a testbed's loop term.

A profile times `Engine.step` (`calib.profile_runner`); a live worker's loop then hands the report to its
sender thread and admits what arrived before the next step starts (`executor.worker.process`). A live
iteration log (`sangam live --iteration-log`) records each step's `start` and `end` and, where the loop went
straight on, `cycle_s` from that start to the next one's: `cycle_s - (end - start)` is the loop's own time.
`sangam fit --loop DIR...` fits it as `a + b * items` by least squares over every such iteration, so the
simulator charges its mean per iteration (`sangam.cost.LoopCosts`: `other_ms`, `other_item_ms`).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path

from profiles.shapes import Shape
from profiles.testbed import LoopEntry, Sourced, Testbed
from runs.build import ROOT

MIN_ITERATIONS = 100  # fewer straight-on iterations say little about a loop that takes a tenth of a ms
COLUMNS = ("start", "end", "items", "cycle_s")


def loop_samples(dirs: Sequence[Path]) -> list[tuple[int, float]]:
    """(items, seconds between the step's end and the next step's start) of every iteration the loop went
    straight on from, in the runs' iterations.csv; ValueError (one line) for a run without such a log."""
    samples = []
    for directory in dirs:
        log = directory / "iterations.csv"
        if not log.is_file():
            raise ValueError(f"{directory}: no iterations.csv (run sangam live with --iteration-log)")
        with log.open(newline="") as f:
            rows = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (rows.fieldnames or ())]
            if missing:
                raise ValueError(f"{log}: not an iteration log with cycles (no {', '.join(missing)} column)")
            for line, row in enumerate(rows, start=2):
                try:
                    cycle = float(row["cycle_s"] or 0.0)
                    if cycle > 0 and row["items"]:
                        shape = Shape.parse(row["items"])
                        between = cycle - (float(row["end"]) - float(row["start"]))
                        samples.append((len(shape.prefills) + len(shape.decodes), between))
                except (KeyError, ValueError) as err:
                    raise ValueError(f"{log}, line {line}: not an iteration log row ({err})") from None
    return samples


def fit_loop(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) in seconds of the least-squares line a + b * items through `samples`; with one item count
    only, its mean and 0. ValueError (one line) for too few samples or a line below zero."""
    if len(samples) < MIN_ITERATIONS:
        raise ValueError(
            f"--loop: {len(samples)} iterations the loop went straight on from; {MIN_ITERATIONS} at least"
        )
    items, seconds = [float(n) for n, _ in samples], [s for _, s in samples]
    if len(set(items)) == 1:
        return statistics.fmean(seconds), 0.0
    b, a = statistics.linear_regression(items, seconds)
    if a < 0 or b < 0:
        raise ValueError(f"--loop: the fitted loop {a * 1e3:.4f} ms + {b * 1e3:.4f} ms per item is negative")
    return a, b


def looped_testbed(base: Testbed, name: str, dirs: Sequence[Path]) -> Testbed:
    """`base` (a testbed of our executor: no loop of its own) charging the loop measured in `dirs`, its
    version raised by one."""
    if base.loop is not None:
        raise ValueError(f"--loop: {base.name} already charges a worker loop; base one of ours without")
    samples = loop_samples(dirs)
    a, b = fit_loop(samples)
    runs = ", ".join(str(_shown(d.resolve())) for d in dirs)
    source = (
        f"measured live: our worker loop from a step's end to the next step's start, least squares "
        f"a + b * items over {len(samples)} iterations the loop went straight on from ({runs}); "
        f"sangam fit --loop, calib/worker_loop.py"
    )
    apart = "none apart: the sender thread sends the reports, and what that costs the loop is in other_ms"
    loop = LoopEntry(
        Sourced(0.0, apart), Sourced(0.0, apart), Sourced(a * 1e3, source), Sourced(b * 1e3, source)
    )
    version = base.version + 1
    note = (
        f" Version {version}: its worker loop between steps, which the profile does not time "
        f"({a * 1e3:.3f} ms + {b * 1e3:.3f} ms per item an iteration), measured live (sangam fit --loop)."
    )
    described = base.description + note
    return dataclasses.replace(base, name=name, version=version, loop=loop, description=described)


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
