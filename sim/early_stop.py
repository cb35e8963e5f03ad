"""Ending a search's probe as soon as it cannot meet its SLO.

At simulated time `now` every request's end-to-end latency is at least a bound: its latency if it has
ended, `now - arrival` if it has arrived, else 0. A mean or a quantile (median, p90, p99, as the summary
computes them) never falls when one value rises, so the same statistic over the bounds is at most the
run's final value. Once it exceeds the limit the run fails the SLO whatever happens next, and a search
stops it there: an overloaded probe costs the few simulated seconds its backlog takes to pass the limit
rather than the whole trace.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from runs.results import percentile
from sangam.request import Request

QUANTILES = {"median": 50.0, "p90": 90.0, "p99": 99.0}
STATS = ("mean", *QUANTILES)


@dataclass(frozen=True, slots=True)
class Exceeds:
    """The run fails once its `stat` (mean, median, p90, p99) of end-to-end latency is certain to
    exceed `limit_ms`."""

    stat: str
    limit_ms: float

    def __post_init__(self) -> None:
        if self.stat not in STATS:
            raise ValueError(f"cannot bound the {self.stat} of a partial run: use one of {', '.join(STATS)}")

    @property
    def key(self) -> str:
        """The summary key the rule bounds."""
        return f"{self.stat}_e2el_ms"

    def bound_ms(self, bounds: Sequence[float]) -> float:
        """The statistic over the requests' sorted latency bounds (seconds), in milliseconds."""
        if self.stat == "mean":
            return 1000 * sum(bounds) / len(bounds)
        return 1000 * percentile(bounds, QUANTILES[self.stat])


def latency_bounds(requests: Sequence[Request], now: float) -> list[float]:
    """Each request's end-to-end latency, or the least it can still be at `now`; sorted."""
    bounds = []
    for req in requests:
        if req.finished:
            end = req.blocks[-1].end
            assert end is not None
            bounds.append(end - req.arrival)
        else:
            bounds.append(max(0.0, now - req.arrival))
    bounds.sort()
    return bounds


class EarlyStop:
    """`rules` watched over `requests`, told of each request's end (`ended`). Between two ends only
    sorted lists and sums change, so each end costs a few bisections: a probe that runs to the end
    pays little, and one that cannot meet its SLO stops at the first end after that became certain.
    The quick test may only err towards looking (a float a few ulps off); a stop is always confirmed
    over every request's bound (`latency_bounds`). `bounds` then holds each rule's bound (summary
    key -> ms)."""

    def __init__(self, rules: Sequence[Exceeds], requests: Sequence[Request]) -> None:
        self.rules = tuple(rules)
        self.requests = requests
        self.bounds: dict[str, float] = {}
        self._arrivals = sorted(req.arrival for req in requests)
        self._arrival_sums = list(itertools.accumulate(self._arrivals, initial=0.0))
        self._latencies: list[float] = []  # of the ended requests, sorted
        self._ended_arrivals: list[float] = []  # theirs, sorted
        self._latency_sum = 0.0
        self._ended_arrival_sum = 0.0

    def ended(self, req: Request, now: float) -> bool:
        """`req` has ended at `now`: True once some rule is certain to fail."""
        end = req.blocks[-1].end
        assert end is not None
        latency = end - req.arrival
        bisect.insort(self._latencies, latency)
        bisect.insort(self._ended_arrivals, req.arrival)
        self._latency_sum += latency
        self._ended_arrival_sum += req.arrival
        if not any(self._may_exceed(rule, now) for rule in self.rules):
            return False
        bounds = latency_bounds(self.requests, now)
        values = {rule.key: rule.bound_ms(bounds) for rule in self.rules}
        if any(values[rule.key] > rule.limit_ms for rule in self.rules):
            self.bounds = values
            return True
        return False

    def _may_exceed(self, rule: Exceeds, now: float) -> bool:
        n, limit_s = len(self._arrivals), rule.limit_ms / 1000
        if rule.stat == "mean":  # the ended latencies, plus now - arrival for the others that arrived
            arrived = bisect.bisect_right(self._arrivals, now)
            waiting = arrived - len(self._latencies)
            waiting_arrivals = self._arrival_sums[arrived] - self._ended_arrival_sum
            total = self._latency_sum + waiting * now - waiting_arrivals
            return total / n > limit_s * (1 - 1e-9)
        # the quantile interpolates between sorted values lo and hi = lo + 1; it can exceed the limit only
        # if value hi does, i.e. if at least n - hi bounds do (one fewer asked: floats)
        hi = min(math.floor((n - 1) * QUANTILES[rule.stat] / 100) + 1, n - 1)
        over = len(self._latencies) - bisect.bisect_right(self._latencies, limit_s)
        cut = now - limit_s  # a request still running exceeds the limit if it arrived before this
        over += bisect.bisect_left(self._arrivals, cut) - bisect.bisect_left(self._ended_arrivals, cut)
        return over >= n - hi - 1
