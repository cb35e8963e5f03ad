"""Did a run keep up with its arrivals? A trend test on the number of requests in the system.

A run that keeps up serves requests as fast as they arrive, so the number in the system (arrived, not
yet ended) stays level; one above its capacity serves at its capacity, and the number grows by the
difference every second. A short run ends before that growth has made latencies large, so an SLO on
latency alone passes it. The test looks at the growth itself:

- the window is the second half of the arrivals (from the arrival of the middle request to the last
  one): the first half lets a run that starts empty fill up;
- the window is cut into `BATCHES` equal stretches of time, and each stretch's time-averaged number in
  the system is computed exactly from the arrival and end times (batch means);
- the least-squares slope of the batch means on time is the growth rate `growth_qps` (requests/s): the
  offered rate less the served one;
- its noise is taken as that of a random walk, the worst case of a system that keeps up: at its
  capacity, the number in the system wanders like a random walk (each arrival a step up, each end a
  step down), and below it it wanders less, pulled back to its mean. The walk's variance per second is
  estimated from the batch means themselves (the increments of consecutive batch means of a random walk
  with variance s^2 per second have variance 2 s^2 w / 3, w a batch's length), and the least-squares
  slope of a random walk over a window of T seconds has variance 6 s^2 / (5 T). So the standard error
  holds for any arrival process and workload (bursty arrivals and long outputs make the walk wider), and
  is an upper bound below capacity;
- the run kept up unless the growth is significant: above `T_CRIT` standard errors (Student's t with
  `BATCHES - 2` degrees of freedom, one-sided 5%).

`T_CRIT` standard errors is the test's resolution: a smaller deficit (offered less served) can go
unseen. A random walk's resolution falls as T^-1/2, so a run needs about `(resolution / deficit)^2`
times as many requests to resolve a given deficit (`requests_needed`). Before a run, the resolution a
system at its capacity would give is `resolution_bound`: it grows with the rate, as rate / sqrt(requests).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BATCHES = 10
T_CRIT = 1.860  # Student's t with 8 (BATCHES - 2) degrees of freedom, one-sided 5%
MIN_REQUESTS = 4 * BATCHES  # fewer: no test
KEYS = ("steady", "offered_qps", "served_qps", "backlog_growth_qps", "backlog_growth_se")


@dataclass(frozen=True, slots=True)
class Steadiness:
    """The growth of the number in the system over the second half of a run's arrivals (of several
    seeds' runs: their means, `pooled`)."""

    offered_qps: float  # arrivals per second in the window
    growth_qps: float  # the number in the system's growth, requests/s: offered less served
    growth_se: float  # its standard error (a random walk's: an upper bound for a run that keeps up)
    requests: int  # the requests of one run

    @property
    def served_qps(self) -> float:
        return self.offered_qps - self.growth_qps

    @property
    def resolution_qps(self) -> float:
        """The growth that a run this long tells from none (significant at 5%, one-sided)."""
        return T_CRIT * self.growth_se

    @property
    def kept_up(self) -> bool:
        """No significant growth: the served rate is within noise of the offered rate."""
        return self.growth_qps <= self.resolution_qps

    def summary(self) -> dict[str, float | bool]:
        """The keys a point's summary gains (`KEYS`)."""
        return dict(
            zip(KEYS, (self.kept_up, self.offered_qps, self.served_qps, self.growth_qps, self.growth_se),
                strict=True)
        )  # fmt: skip

    @classmethod
    def from_summary(cls, summary: dict[str, object]) -> Steadiness | None:
        """The test a summary records, if it records one."""
        if summary.get("backlog_growth_se") is None:
            return None
        return cls(
            float(summary["offered_qps"]),  # type: ignore[arg-type]
            float(summary["backlog_growth_qps"]),  # type: ignore[arg-type]
            float(summary["backlog_growth_se"]),  # type: ignore[arg-type]
            int(summary.get("completed", 0)),  # type: ignore[call-overload]
        )


def steadiness(arrivals: Iterable[float], ends: Iterable[float]) -> Steadiness | None:
    """The test over requests arriving at `arrivals` and ending at `ends` (a request that has not
    ended is left out of `ends`: it never leaves); None for fewer than `MIN_REQUESTS` requests or a
    window that spans no time."""
    arrived = sorted(arrivals)
    ended = sorted(ends)
    n = len(arrived)
    if n < MIN_REQUESTS:
        return None
    start, stop = arrived[n // 2], arrived[-1]
    if not stop > start:
        return None
    width = (stop - start) / BATCHES
    edges = [start + width * i for i in range(BATCHES)] + [stop]
    in_system = _Area(arrived), _Area(ended)
    areas = [in_system[0](t) - in_system[1](t) for t in edges]  # the number in the system, integrated
    means = [(b - a) / width for a, b in itertools.pairwise(areas)]
    centres = [start + width * (i + 0.5) for i in range(BATCHES)]
    slope = _slope(centres, means)
    steps = [b - a for a, b in itertools.pairwise(means)]
    mean_step = sum(steps) / len(steps)
    step_var = sum((d - mean_step) ** 2 for d in steps) / (len(steps) - 1)  # the drift taken out
    walk_var = 1.5 * step_var / width  # per second
    se = math.sqrt(1.2 * walk_var / (stop - start))
    offered = (n - 1 - n // 2) / (stop - start)
    return Steadiness(offered, slope, se, n)


def pooled(runs: Sequence[Steadiness]) -> Steadiness:
    """Several seeds' tests of one configuration as one: the mean growth and its standard error."""
    k = len(runs)
    return Steadiness(
        sum(r.offered_qps for r in runs) / k,
        sum(r.growth_qps for r in runs) / k,
        math.sqrt(sum(r.growth_se**2 for r in runs)) / k,
        min(r.requests for r in runs),
    )


def resolution_bound(qps: float, requests: int, arrival_cv: float = 1.0) -> float:
    """The resolution, requests/s, of a run of `requests` requests at `qps` whose number in the system
    is the random walk of a system at its capacity (the worst case of one that keeps up): arrivals with
    gaps of coefficient of variation `arrival_cv` (1: Poisson) and as many Poisson ends, a walk of
    variance qps (1 + cv^2) per second, over the window of the second half of the arrivals (`requests` at
    least `MIN_REQUESTS`)."""
    window = (requests - 1 - requests // 2) / qps
    return T_CRIT * math.sqrt(1.2 * qps * (1 + arrival_cv**2) / window)


def requests_needed(requests: int, resolution: float, deficit: float) -> int:
    """About how many requests a run needs to resolve `deficit` (requests/s) where `requests` resolved
    `resolution` (a random walk's: as the square root of the length), to two significant figures."""
    if resolution <= deficit:
        return requests
    needed = max(1.0, requests * (resolution / deficit) ** 2)
    unit = 10 ** max(0, int(math.log10(needed)) - 1)
    return int(math.ceil(needed / unit) * unit)


class _Area:
    """t -> the integral from 0 to t of the number of `times` at or before t, i.e. sum(t - x) over x <= t
    (`times` sorted)."""

    def __init__(self, times: Sequence[float]) -> None:
        self.times = times
        self.sums = list(itertools.accumulate(times, initial=0.0))

    def __call__(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t)
        return k * t - self.sums[k]


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ys on xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
