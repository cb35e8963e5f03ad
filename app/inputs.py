"""The sidebar's values, checked: every problem is an `InputError` whose message is one line for the page."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from app.sweep import COSTS, PointSpec, point_specs, resolve
from runs.config import RunConfig
from runs.traces import TraceError, read_trace
from sangam.budget import Policy
from sangam.layout import parse_mode
from sangam.progress import parse_progress
from sangam.workload import TraceRow
from sim.setup import Setup as Resolved

MAX_POINTS = 400  # layouts x rates x seeds in one comparison
MAX_TRACE_ROWS = 50_000  # rows of an uploaded trace read, the most a point runs: parsing 2,000,000 took 14 s
# and 1 GB in the page's server, holding its other sessions up to 1.4 s at a time
# requests simulated in one comparison (or one round of a search's probes): a point of 50,000 takes ~10 s
# on one core, so a million take minutes on the page's processes (400 points of 50,000 would take hours)
MAX_REQUESTS = 1_000_000
TRACE_SUFFIXES = ("csv", "jsonl", "json")


class InputError(ValueError):
    """Bad input from the page; the message says what to change."""


@dataclass(frozen=True, slots=True)
class UploadedTrace:
    name: str
    rows: tuple[TraceRow, ...]  # its first MAX_TRACE_ROWS, arrival times removed: the sweep draws them
    digest: str  # sha256 of the file's bytes
    had_arrivals: bool
    cut: bool = False  # the file has rows past those read

    def text(self) -> str:
        """How the page names it: 'uploaded t.csv (500 rows)'."""
        if self.cut:
            return f"uploaded {self.name} (its first {len(self.rows):,} rows; the file has more)"
        return f"uploaded {self.name} ({len(self.rows):,} rows)"


@dataclass(frozen=True, slots=True)
class Setup:
    """A validated comparison: every point it runs, and what the page needs to describe it."""

    resolved: Resolved  # the first layout, rate and seed on the testbed
    layouts: tuple[str, ...]  # layout names, e.g. ("8C", "5P3D")
    rates: tuple[float, ...]
    seeds: tuple[int, ...]
    trace: UploadedTrace | None

    @property
    def base(self) -> RunConfig:
        return self.resolved.config

    def specs(self) -> list[PointSpec]:
        rows, digest = (self.trace.rows, self.trace.digest) if self.trace else (None, "")
        return point_specs(
            self.resolved, self.layouts, self.rates, self.seeds, rows=rows, trace_digest=digest
        )


def parse_layouts(text: str, gpus: int) -> tuple[str, ...]:
    """Layout names from 'colocated, 5P3D, 3P5C' (commas or spaces); each must use exactly `gpus` GPUs."""
    if gpus < 1:
        raise InputError(f"the GPU count must be at least 1, got {gpus}")
    items = [item for item in re.split(r"[,\s]+", text) if item]
    if not items:
        raise InputError("choose at least one layout to compare, e.g. colocated, 5P3D, 3P5C")
    names: list[str] = []
    for item in items:
        try:
            layout = parse_mode(item, gpus)
        except ValueError as err:
            raise InputError(str(err)) from None
        if layout.num_workers != gpus:
            raise InputError(
                f"layout {item} uses {layout.num_workers} GPUs but the GPU count is {gpus}: "
                f"compare layouts of {gpus} GPUs, e.g. {', '.join(example_layouts(gpus))}"
            )
        if layout.name not in names:
            names.append(layout.name)
    return tuple(names)


def example_layouts(gpus: int) -> list[str]:
    """A few valid layouts of `gpus` GPUs, for messages and help text."""
    examples = ["colocated"]
    if gpus >= 2:
        prefill = max(1, gpus * 5 // 8)
        examples += [f"{prefill}P{gpus - prefill}D", f"{gpus - prefill}P{prefill}C"]
    return examples


def qps_points(low: float, high: float, points: int) -> tuple[float, ...]:
    """`points` evenly spaced rates from `low` to `high` (requests per second)."""
    if points < 1:
        raise InputError(f"the QPS range needs at least one point, got {points}")
    if not low > 0:
        raise InputError(f"the lowest QPS must be positive, got {low:g}")
    if low > high:
        raise InputError(f"the QPS range is empty: min {low:g} is above max {high:g}")
    step = (high - low) / (points - 1) if points > 1 else 0.0
    # rates are shown to 4 decimals: rounding may merge close points, or round the lowest to 0
    rates = tuple(dict.fromkeys(round(low + i * step, 4) for i in range(points)))
    if not rates[0] > 0:
        raise InputError(f"the lowest QPS must be at least 0.0001, got {low:g}")
    return rates


def parse_seeds(text: str) -> tuple[int, ...]:
    """Seeds from '0' or '0, 1, 2'; results are averaged over them."""
    items = [item for item in re.split(r"[,\s]+", text) if item]
    if not items:
        raise InputError("give at least one seed, e.g. 0 or 0, 1, 2")
    try:
        seeds = [int(item) for item in items]
    except ValueError:
        raise InputError(f"seeds must be whole numbers separated by commas, got {text!r}") from None
    return tuple(dict.fromkeys(seeds))


def default_mask_len(trace: str) -> int:
    """The mask buffer a run on `trace` uses unless one is set: 1024 ShareGPT and trace files, 512 arXiv."""
    return RunConfig(trace=trace).mask_tokens


def check_progress(spec: str) -> str:
    """'' (the model and trace's default) or a valid fixed:D, uniform:LO:HI or betabinom:MEAN:STD."""
    spec = spec.strip()
    if not spec:
        return ""
    if spec.partition(":")[0] == "empirical":
        raise InputError(
            "empirical progress needs a steps file: give a trace file with a steps column instead"
        )
    try:
        parse_progress(spec)
    except ValueError as err:
        raise InputError(str(err)) from None
    return spec


def read_uploaded_trace(name: str, data: bytes) -> UploadedTrace:
    """An uploaded .csv or .jsonl trace's first MAX_TRACE_ROWS rows, checked by `runs.traces.read_trace`."""
    base = Path(name).name or "trace"
    suffix = Path(base).suffix.lower().lstrip(".")
    if suffix not in TRACE_SUFFIXES:
        raise InputError(f"{base}: a trace file must end in .csv, .jsonl or .json")
    if b"\n" not in data:
        data = data.replace(b"\r", b"\n")  # a file of CR line ends, which the trace reader takes too
    header = suffix == "csv"
    # the rest in one piece, unparsed (blank lines, which the reader skips, count here: then fewer are read)
    lines = data.rstrip(b"\r\n").split(b"\n", MAX_TRACE_ROWS + header)
    cut = len(lines) > MAX_TRACE_ROWS + header
    if cut:
        lines.pop()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / base
        path.write_bytes(b"\n".join(lines) + b"\n")
        try:
            rows = read_trace(path)
        except TraceError as err:
            raise InputError(str(err).replace(str(path), base)) from None
    had_arrivals = rows[0].arrival_time is not None
    stripped = tuple(dataclasses.replace(row, arrival_time=None) for row in rows)
    return UploadedTrace(base, stripped, hashlib.sha256(data).hexdigest(), had_arrivals, cut)


def build_setup(
    *,
    model: str,
    gpu: str,
    gpus: int,
    layouts: str,
    trace: str,
    upload: UploadedTrace | None,
    qps_min: float,
    qps_max: float,
    qps_count: int,
    budget: int,
    prefill_budget: int,
    theta: int,
    progress: str,
    seeds: str,
    num_requests: int,
    mask_len: int | None = None,
    arrival_cv: float | None = None,
    policy: str = Policy.DEFICIT.value,
    cost: str = "profile",
    testbed: str = "",
) -> Setup:
    """Check every sidebar value and build the comparison, resolved as `sangam sim` resolves a run; the
    first problem raises InputError. The `testbed` (default `sangam-<gpu>`) sets the GPU, KV pages,
    forwards per block (unless `progress` is given), the arrival clip (unless `arrival_cv` is), the KV
    link and the control delay."""
    names = parse_layouts(layouts, gpus)
    rates = qps_points(qps_min, qps_max, qps_count)
    seed_list = parse_seeds(seeds)
    progress = check_progress(progress)
    if cost not in COSTS:
        raise InputError(f"iteration times come from one of {', '.join(COSTS)}, got {cost!r}")
    if trace == "upload" and upload is None:
        raise InputError("upload a trace file (.csv or .jsonl), or pick the sharegpt or arxiv trace")
    points = len(names) * len(rates) * len(seed_list)
    if points > MAX_POINTS:
        raise InputError(f"{points} points is too many for one comparison (at most {MAX_POINTS})")
    per_point = min(num_requests, len(upload.rows)) if trace == "upload" and upload else num_requests
    if points * per_point > MAX_REQUESTS:
        raise InputError(
            f"{points} points of {per_point:,} requests is too many for one comparison (at most "
            f"{MAX_REQUESTS:,} requests in all): fewer points or fewer requests per point"
        )
    try:
        base = RunConfig(
            mode=names[0],
            model=model,
            gpu=gpu,
            gpus=gpus,
            trace=upload.name if trace == "upload" and upload else trace,
            qps=rates[0],
            num_requests=per_point,
            mask_len=mask_len,
            arrival_cv=arrival_cv,
            budget=budget,
            prefill_budget=prefill_budget,
            theta=theta,
            policy=Policy(policy),
            seed=seed_list[0],
        )
        resolved = resolve(base, cost, testbed or None, {"arrival_cv": arrival_cv}, progress or None)
    except ValueError as err:
        raise InputError(str(err)) from None
    uploaded = upload if trace == "upload" else None
    return Setup(resolved, names, rates, seed_list, uploaded)
