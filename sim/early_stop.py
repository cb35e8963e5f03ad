"""Ending a search's probe as soon as it cannot meet its SLO.

At simulated time `now` every request's end-to-end latency is at least a bound: its latency if it has
ended, `now - arrival` if it has arrived, else 0. A mean or a quantile (median, p90, p99, as the summary
computes them) never falls when one value rises, so the same statistic over the bounds is at most the
run's final value. Once it exceeds the limit the run fails the SLO whatever happens next, and a search
stops it there: an overloaded probe costs the few simulated seconds its backlog takes to pass the limit
rather than the whole trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sangam.request import Request
from sangam.results import percentile

QUANTILES = {"median": 50.0, "p90": 90.0, "p99": 99.0}
STATS = ("mean", *QUANTILES)
CHECK_EVERY = 100  # requests ended between two checks (a check looks at every request)


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
    """`rules` watched over `requests`. Told of each request's end, `exceeded(now)` looks every
    `CHECK_EVERY` ends and is True once any rule is certain to fail; `bounds` then holds each rule's
    bound (summary key -> ms)."""

    def __init__(self, rules: Sequence[Exceeds], requests: Sequence[Request]) -> None:
        self.rules = tuple(rules)
        self.requests = requests
        self.bounds: dict[str, float] = {}
        self._ends = 0

    def exceeded(self, now: float) -> bool:
        self._ends += 1
        if self._ends % CHECK_EVERY:
            return False
        bounds = latency_bounds(self.requests, now)
        values = {rule.key: rule.bound_ms(bounds) for rule in self.rules}
        if any(values[rule.key] > rule.limit_ms for rule in self.rules):
            self.bounds = values
            return True
        return False
