"""Our worker loop's own time between steps, measured in live runs' iteration logs, as a testbed's loop term.

A profile times `Engine.step` (`calib.profile_runner`); a live worker's loop then hands the report to its
sender thread and admits what arrived before the next step starts (`executor.worker.process`). A live
iteration log (`sangam live --iteration-log`) records each step's `start` and `end` and, where the loop went
straight on, `cycle_s` from that start to the next one's: `cycle_s - (end - start)` is the loop's own time
(in logs written before the log's `end` was stamped after the report's assembly, 2026-12-04, it also holds
that tail of the step, tens of microseconds, which a profile times too). `sangam fit --loop DIR...` fits it
as `a + b * min(items, cap)` by least squares over every such iteration, so the simulator charges its mean
per iteration (`sangam.cost.LoopCosts`: `other_ms`, `other_item_ms`, `other_items_cap`); the cap keeps the
line within the item counts it was fitted on.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from profiles.shapes import Shape
from profiles.store import paths
from profiles.testbed import LoopEntry, Sourced, Testbed
from runs.build import shown
from runs.live_summary import check_measured, run_config
from sangam.hardware import MODELS

MIN_ITERATIONS = 100  # fewer straight-on iterations say little about a loop that takes a tenth of a ms
MIN_PER_COUNT = 100  # iterations of an item count, at least, for the fit to reach it
COLUMNS = ("start", "end", "items", "cycle_s")


def loop_samples(dirs: Sequence[Path]) -> list[tuple[int, float]]:
    """(items, seconds between the step's end and the next step's start) of every iteration the loop went
    straight on from, in the runs' iterations.csv; ValueError (one line) for a run without such a log."""
    samples = []
    for directory in dirs:
        log = directory / "iterations.csv"
        if not log.is_file():
            raise ValueError(f"{directory}: no iterations.csv (run sangam live with --iteration-log)")
        try:
            rows = csv.DictReader(log.read_text().splitlines())
        except UnicodeDecodeError:
            raise ValueError(f"{log}: not UTF-8 text") from None
        missing = [c for c in COLUMNS if c not in (rows.fieldnames or ())]
        if missing:
            raise ValueError(f"{log}: not an iteration log with cycles (no {', '.join(missing)} column)")
        for line, row in enumerate(rows, start=2):
            try:
                cycle = float(row["cycle_s"] or 0.0)
                if cycle > 0 and row["items"]:
                    shape = Shape.parse(row["items"])
                    start, end = float(row["start"]), float(row["end"])
                    if not all(map(math.isfinite, (cycle, start, end))) or end < start:
                        raise ValueError(f"a step from {start:g} to {end:g} s in a cycle of {cycle:g} s")
                    samples.append((len(shape.prefills) + len(shape.decodes), cycle - (end - start)))
            except (KeyError, TypeError, ValueError) as err:  # TypeError: a short row's missing field is None
                raise ValueError(f"{log}, line {line}: not an iteration log row ({err})") from None
    return samples


@dataclass(frozen=True, slots=True)
class LoopFit:
    """The loop's time a + b * min(items, cap), in seconds."""

    a: float
    b: float
    cap: int

    def text(self) -> str:
        return f"{self.a * 1e3:.3f} ms + {self.b * 1e3:.3f} ms per item up to {self.cap}"


def fit_loop(samples: Sequence[tuple[int, float]]) -> LoopFit:
    """The least-squares a + b * min(items, cap) through `samples`, cap the item count (of those seen at
    least `MIN_PER_COUNT` times) that fits best: the loop's time grows with its first items and then levels
    off, and a line is not carried past the counts it was fitted on. ValueError (one line) for too few
    samples."""
    if len(samples) < MIN_ITERATIONS:
        raise ValueError(
            f"--loop: {len(samples)} iterations the loop went straight on from; {MIN_ITERATIONS} at least"
        )
    counts = Counter(n for n, _ in samples)
    well_seen = (n for n, seen in counts.items() if seen >= MIN_PER_COUNT)
    caps = sorted({min(counts), *well_seen})  # the first gives the mean
    fits = [fit for cap in caps if (fit := _line(samples, cap)) is not None]
    return min(fits, key=lambda fit: _squares(samples, fit))


def _line(samples: Sequence[tuple[int, float]], cap: int) -> LoopFit | None:
    """The least-squares line in min(items, cap); its mean where that is one value; None where it falls
    or starts below zero."""
    items, seconds = [float(min(n, cap)) for n, _ in samples], [s for _, s in samples]
    if len(set(items)) == 1:
        return LoopFit(max(0.0, statistics.fmean(seconds)), 0.0, cap)
    b, a = statistics.linear_regression(items, seconds)
    return LoopFit(a, b, cap) if a >= 0 and b >= 0 else None


def _squares(samples: Sequence[tuple[int, float]], fit: LoopFit) -> float:
    return sum((s - fit.a - fit.b * min(n, fit.cap)) ** 2 for n, s in samples)


def looped_testbed(base: Testbed, name: str, dirs: Sequence[Path], data: Path) -> Testbed:
    """`base` (a testbed of our executor: no loop of its own, priced by profiles that `sangam profile`
    measured, under `data` or elsewhere) charging the loop measured in `dirs` (runs on its GPU), its
    version raised by one."""
    if base.loop is not None:
        raise ValueError(f"--loop: {base.name} already charges a worker loop; base one of ours without")
    for model in MODELS:
        meta = paths(model, base.profile_dir(model), data)[1]
        if meta.is_file() and _merged_logs(meta):
            raise ValueError(
                f"--loop: {base.name}'s profile of {model} ({shown(meta)}) was refitted from live "
                "iteration logs (sangam profile --from-log), whose times hold the loop already; base a "
                "testbed whose profiles sangam profile measured"
            )
    dirs = list(dict.fromkeys(d.resolve() for d in dirs))  # a run given twice counts once
    for directory in dirs:
        gpu = _run_gpu(directory)
        if gpu != base.gpu:
            raise ValueError(f"--loop {directory}: a run on {gpu}, not {base.name}'s {base.gpu}")
    samples = loop_samples(dirs)
    fit = fit_loop(samples)
    runs = ", ".join(str(shown(d)) for d in dirs)
    source = (
        f"measured live: our worker loop from a step's end to the next step's start (with the step's own "
        f"tail after its end stamp, tens of microseconds, which a profile times too), least squares "
        f"a + b * min(items, cap) over {len(samples)} iterations the loop went straight on from ({runs}); "
        f"sangam fit --loop, calib/worker_loop.py"
    )
    apart = "none apart: the sender thread sends the reports, and what that costs the loop is in other_ms"
    loop = LoopEntry(
        Sourced(0.0, apart), Sourced(0.0, apart), Sourced(fit.a * 1e3, source), Sourced(fit.b * 1e3, source),
        Sourced(float(fit.cap), source),
    )  # fmt: skip
    version = base.version + 1
    note = (
        f" Version {version}: its worker loop between steps, which the profile does not time "
        f"({fit.text()} an iteration), measured live (sangam fit --loop)."
    )
    described = base.description + note
    return dataclasses.replace(base, name=name, version=version, loop=loop, description=described)


def _merged_logs(meta: Path) -> bool:
    """Whether a profile's metadata lists live logs merged into its data; ValueError naming an unreadable
    one."""
    try:
        return bool(json.loads(meta.read_text(encoding="utf-8")).get("merged_logs"))
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise ValueError(f"{shown(meta)}: not a profile's metadata (JSON)") from None


def _run_gpu(directory: Path) -> str:
    """The GPU a live run of a modelled model on GPUs ran on; ValueError (one line) for any other run."""
    config = run_config(directory)
    check_measured(config, f"--loop {directory}")
    return str(config.get("gpu"))
