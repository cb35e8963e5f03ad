"""The highest rate at which a configuration meets an SLO: bracketing by doubling, then bisection.

Rates are whole multiples of the granularity `g`, so a search's probes are points a sweep can share
(and cache). From the start rate the search doubles while the SLO holds; the first failure brackets the
answer between the last pass `lo` (0 if none) and that failure `hi`, and bisection halves the bracket
until `hi - lo == g`. The answer is `lo`: probed, and met; `lo + g` was probed, and failed. Each probe
runs once per seed; a metric meets its limit when its mean over the seeds does. The search assumes the
metric grows with the rate; where it does not (few requests, noise), the answer is a rate that meets
the SLO with a failing rate one step above, not necessarily the highest such.

A probe meets the SLO only if it also kept up with its arrivals (`sim.steady`: no significant growth of
the number of requests in the system over the second half of the run, the seeds pooled): a run too
short for an overloaded system's latency to grow would otherwise pass. The test's resolution at the
answer says how far above the capacity the answer can be; where it is coarser than the granularity the
run was too short to tell (`Answer.too_short`). So the default granularity is one the runs can resolve:
the test's resolution bound at the start rate (`default_granularity`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs.args import positive_float
from runs.options import nonempty_path, option
from runs.results import METRICS
from runs.tally import Tally, Watcher
from sim.early_stop import STATS as EARLY_STATS
from sim.early_stop import Exceeds
from sim.steady import MIN_REQUESTS, Steadiness, pooled, requests_needed, resolution_bound
from sim.sweep import Cache, Counts, Point, Runner, evaluate

STATS = {"mean": "mean", "std": "std", "median": "median", "p50": "median", "p90": "p90", "p99": "p99"}
OTHER = ("overflow_rate", "kv_transferred_gb")  # summary keys without a time unit
MAX_STEPS = 10**12  # --max-qps over the granularity, at most (a bracket probes its logarithm's worth)
MARKS = {"+": "met every SLO and kept up", "-": "missed an SLO", "^": "did not keep up: its backlog grew"}
_SLO = re.compile(r"\s*([a-z0-9_]+)\s*(?:<=|=)\s*([-+0-9.eE]+)\s*")


@dataclass(frozen=True, slots=True)
class Slo:
    """`key` (a summary key) at most `limit` (in the summary's unit); `text` as given."""

    key: str
    limit: float
    text: str

    def value(self, summaries: Sequence[dict[str, Any]]) -> float:
        """The metric's mean over the seeds' summaries (of a run stopped early: its lower bound; of one where
        no request completed, a latency's: infinite)."""
        values = [s.get("lower_bounds", {}).get(self.key, s.get(self.key, math.inf)) for s in summaries]
        return sum(float(v) for v in values) / len(values)

    def stop_rule(self, seeds: int) -> Exceeds | None:
        """What stops a probe's run once it is certain to fail this SLO, if its metric can be bounded
        in a partial run: a seed whose own value exceeds `seeds` times the limit makes the mean over
        the seeds exceed it."""
        stat, _, metric = self.key.partition("_")
        if metric != "e2el_ms" or stat not in EARLY_STATS:
            return None
        return Exceeds(stat, self.limit * seeds)


def parse_slo(text: str) -> Slo:
    """`p99_e2el_s=20` (also `<=`): a `<stat>_<metric>_<s|ms>` of the summary, or overflow_rate."""
    m = _SLO.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad SLO {text!r}: use METRIC=LIMIT, for example p99_e2el_s=20")
    name, limit_text = m[1], m[2]
    try:
        limit = float(limit_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad SLO {text!r}: {limit_text!r} is not a number") from None
    if not limit > 0:
        raise argparse.ArgumentTypeError(f"bad SLO {text!r}: the limit must be positive")
    if name in OTHER:
        return Slo(name, limit, text)
    stat, _, rest = name.partition("_")
    metric, _, unit = rest.rpartition("_")
    if stat not in STATS or metric not in METRICS or unit not in ("s", "ms"):
        raise argparse.ArgumentTypeError(
            f"unknown SLO metric {name!r}: use <{'|'.join(STATS)}>_<{'|'.join(METRICS)}>_<s|ms>"
            f" or one of {', '.join(OTHER)}"
        )
    return Slo(f"{STATS[stat]}_{metric}_ms", limit * (1000 if unit == "s" else 1), text)


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """What `sangam search` looks for and how finely."""

    slo: tuple[Slo, ...] = option(
        None, "a limit every probe must meet, METRIC=LIMIT (p99_e2el_s=20, mean_queue_ms=500, "
        "overflow_rate=0.1); several allowed", parse=parse_slo, many=True, metavar="METRIC=LIMIT",
    )  # fmt: skip
    granularity: float | None = option(
        None, "the answer's precision, requests/s", parse=positive_float,
        default_text="one the runs resolve: the steadiness test's resolution bound at the start rate, "
        "rounded up to 1, 2 or 5 times a power of 10",
    )  # fmt: skip
    start_qps: float | None = option(
        None, "the first rate probed, requests/s", parse=positive_float,
        default_text="1 per GPU of the configuration",
    )  # fmt: skip
    max_qps: float = option(1024.0, "stop doubling above this rate, requests/s", parse=positive_float)
    out: Path = option(
        Path("search.csv"), "the ranking, .csv or .json (any other path: a directory, for search.csv)",
        parse=nonempty_path, metavar="PATH",
    )  # fmt: skip


@dataclass(slots=True)
class Bracket:
    """One configuration's search, in units of the granularity: `lo` met the SLO (0: nothing yet),
    `hi` failed it (None: not yet)."""

    start: int
    cap: int
    lo: int = 0
    hi: int | None = None
    probes: list[tuple[int, bool, dict[str, float]]] = field(default_factory=list)
    tests: dict[int, Steadiness] = field(default_factory=dict)  # rate -> its probe's steadiness

    def next(self) -> int | None:
        """The next rate to probe, or None when the answer is known."""
        if self.hi is None:
            rate = self.start if self.lo == 0 else 2 * self.lo
            return rate if rate <= self.cap else None
        return (self.lo + self.hi) // 2 if self.hi - self.lo > 1 else None

    def record(self, rate: int, passed: bool, values: dict[str, float]) -> None:
        self.probes.append((rate, passed, values))
        if passed:
            self.lo = max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)

    def left(self) -> int:
        """An estimate of the probes still to come: the bisection's, once bracketed; before that, one
        more doubling (assumed to fail) and the bisection after it."""
        if self.next() is None:
            return 0
        if self.hi is None:
            return 1 + ((self.lo or self.start) - 1).bit_length()
        return (self.hi - self.lo - 1).bit_length()

    @property
    def capped(self) -> bool:
        """The SLO still held at the highest rate allowed: the answer is a lower bound."""
        return self.hi is None


@dataclass(frozen=True, slots=True)
class Answer:
    point: Point  # the configuration (its rate and seed are those of the first probe)
    max_qps: float
    capped: bool
    probes: tuple[tuple[float, bool, dict[str, float]], ...]
    tests: tuple[Steadiness | None, ...] = ()  # each probe's steadiness (None: not run to the end)

    @property
    def steadiness(self) -> Steadiness | None:
        """The test at the answer's rate (None: no probe met the SLO, or its runs were not tested)."""
        for (qps, _, _), test in zip(self.probes, self._tests(), strict=True):
            if qps == self.max_qps:
                return test
        return None

    def probe_marks(self) -> tuple[str, ...]:
        """Each probe's mark (`MARKS`), in order."""
        return tuple(
            "+" if ok else "^" if test is not None and not test.kept_up else "-"
            for (_, ok, _), test in zip(self.probes, self._tests(), strict=True)
        )

    def marks(self) -> str:
        """The probes in order, each rate with its mark: `8+ 16^ 12-`."""
        return " ".join(
            f"{qps:g}{mark}" for (qps, _, _), mark in zip(self.probes, self.probe_marks(), strict=True)
        )

    def too_short(self, granularity: float) -> int | None:
        """None if the runs resolve a backlog growing by `granularity` at the answer, else about how
        many requests per run would."""
        test = self.steadiness
        if test is None or test.resolution_qps <= granularity:
            return None
        return requests_needed(test.requests, test.resolution_qps, granularity)

    def _tests(self) -> tuple[Steadiness | None, ...]:
        return self.tests or (None,) * len(self.probes)


def legend() -> str:
    """What the probes' marks mean, in a line: `+ met every SLO and kept up, ...`."""
    return ", ".join(f"{mark} {meaning}" for mark, meaning in MARKS.items())


def search(
    configs: Sequence[Point],
    slos: Sequence[Slo],
    seeds: Sequence[int],
    runner: Runner,
    cache: Cache,
    options: SearchOptions,
    counts: Counts | None = None,
    watch: Watcher | None = None,
) -> list[Answer]:
    """Every configuration's highest rate under the SLOs, best first (ties: in the order given). Each
    round probes one rate per unfinished configuration, every seed, all at once on the runner. `watch`
    hears the points (probe x seed) done of an estimated total (`Bracket.left`), and the configurations
    answered."""
    g = granularity(options, configs)
    stop = tuple(rule for slo in slos if (rule := slo.stop_rule(len(seeds))) is not None)
    configs = [dataclasses.replace(c, stop=() if c.sim.failures() else stop) for c in configs]
    if not options.max_qps / g <= MAX_STEPS:
        raise ValueError(
            f"--max-qps {options.max_qps:g} over the granularity {g:g} requests/s: "
            f"more than {MAX_STEPS:g} steps"
        )
    cap = int(options.max_qps / g + 1e-9)
    starts = [_start(options, c) for c in configs]
    brackets = [Bracket(max(1, min(cap, round(start / g))), cap) for start in starts]
    done = 0
    while True:
        todo = [(i, rate) for i, b in enumerate(brackets) if (rate := b.next()) is not None]
        if not todo:
            break
        round_watch = None
        if watch is not None:
            total = done + len(seeds) * sum(b.left() for b in brackets)
            round_watch = _offset(watch, done, total, f"{len(configs) - len(todo)}/{len(configs)} answered")
        points = [
            dataclasses.replace(
                configs[i], config=dataclasses.replace(configs[i].config, qps=_rate(rate, g), seed=seed)
            )
            for i, rate in todo
            for seed in seeds
        ]
        summaries = evaluate(points, runner, cache, counts, round_watch)
        done += len(points)
        for n, (i, rate) in enumerate(todo):
            mine = summaries[n * len(seeds) : (n + 1) * len(seeds)]
            stopped = any("stopped_at_s" in s for s in mine)
            # a stopped probe's end-to-end values are lower bounds; its other metrics cover only the
            # requests ended by then, so they are not shown
            values = {
                slo.text: slo.value(mine) if not stopped or slo.stop_rule(1) else math.nan for slo in slos
            }
            test = _tested(mine)
            met = not stopped and all(slo.value(mine) <= slo.limit for slo in slos)
            brackets[i].record(rate, met and (test is None or test.kept_up), values)
            if test is not None:
                brackets[i].tests[rate] = test
    if watch is not None:
        watch(Tally(done, done, f"{len(configs)}/{len(configs)} answered"))
    answers = [
        Answer(
            p,
            _rate(b.lo, g),
            b.capped,
            tuple((_rate(r, g), ok, v) for r, ok, v in b.probes),
            tuple(b.tests.get(r) for r, _, _ in b.probes),
        )
        for p, b in zip(configs, brackets, strict=True)
    ]
    return sorted(answers, key=lambda a: -a.max_qps)


def granularity(options: SearchOptions, configs: Sequence[Point]) -> float:
    """The granularity given, or else `default_granularity`."""
    return options.granularity or default_granularity(options, configs)


def default_granularity(options: SearchOptions, configs: Sequence[Point]) -> float:
    """The steadiness test's resolution bound (`sim.steady.resolution_bound`) at the highest start
    rate of `configs`, rounded up to 1, 2 or 5 times a power of 10: a granularity their runs resolve
    near the start rate and, the bound being a worst case and rounded up, some way above it; on round
    rates, which a sweep's points share."""
    bound = max(
        resolution_bound(
            _start(options, c), max(c.config.num_requests, MIN_REQUESTS), c.config.arrival_cv or 1.0
        )
        for c in configs
    )
    power = 10.0 ** math.floor(math.log10(bound))
    return float(f"{min(m for m in (1, 2, 5, 10) if m * power >= bound) * power:.10g}")


def _start(options: SearchOptions, config: Point) -> float:
    """The first rate probed: 1 QPS per GPU unless given (a capacity grows with the GPUs)."""
    return options.start_qps or float(config.config.layout.num_workers)


def _tested(summaries: Sequence[dict[str, Any]]) -> Steadiness | None:
    """The seeds' steadiness pooled; None unless every seed's run was tested."""
    tests = [Steadiness.from_summary(s) for s in summaries]
    done = [t for t in tests if t is not None]
    return pooled(done) if done and len(done) == len(tests) else None


def _offset(watch: Watcher, before: int, total: int, note: str) -> Watcher:
    """`watch` told of one round's points as part of the whole search."""
    return lambda tally: watch(Tally(before + tally.done, total, note))


def _rate(units: int, granularity: float) -> float:
    return float(f"{units * granularity:.10g}")
