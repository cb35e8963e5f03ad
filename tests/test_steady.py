"""`sim.steady`: a run keeps up when the number of requests in its system does not grow over the second
half of its arrivals; the growth is the offered rate less the served one."""

from __future__ import annotations

import random
import statistics

import pytest

from sim.steady import MIN_REQUESTS, Steadiness, pooled, requests_needed, resolution_bound, steadiness


def queue(arrival_rate: float, service_rate: float, n: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """One server, first come first served, Poisson arrivals and exponential service: (arrivals, ends)."""
    rng = random.Random(seed)
    arrivals, ends, now, free = [], [], 0.0, 0.0
    for _ in range(n):
        now += rng.expovariate(arrival_rate)
        free = max(free, now) + rng.expovariate(service_rate)
        arrivals.append(now)
        ends.append(free)
    return arrivals, ends


def test_a_server_below_its_capacity_keeps_up() -> None:
    kept = [steadiness(*queue(8.0, 10.0, 4000, seed)) for seed in range(20)]
    assert all(t is not None for t in kept)
    tests = [t for t in kept if t is not None]
    assert sum(t.kept_up for t in tests) >= 19  # 5% one-sided, and the random walk's error is an upper bound
    assert all(t.served_qps == pytest.approx(t.offered_qps, abs=4 * t.growth_se) for t in tests)


@pytest.mark.parametrize(("requests", "offered"), [(500, 20.0), (4000, 12.0)])
def test_a_server_above_its_capacity_does_not_and_serves_at_its_capacity(
    requests: int, offered: float
) -> None:
    """A server of 10 requests/s offered 12 gains a backlog of 2 a second, seen in 4000 requests (500
    resolve some 3 requests/s: they see 10), and serves at its capacity."""
    for seed in range(5):
        test = steadiness(*queue(offered, 10.0, requests, seed))
        assert test is not None and not test.kept_up
        assert test.served_qps == pytest.approx(10.0, abs=3 * test.growth_se + 0.2)


def test_the_resolution_shrinks_as_runs_get_longer() -> None:
    short = pooled([t for s in range(8) if (t := steadiness(*queue(9.5, 10.0, 500, s)))])
    long = pooled([t for s in range(8) if (t := steadiness(*queue(9.5, 10.0, 8000, s)))])
    assert long.resolution_qps < short.resolution_qps / 2


@pytest.mark.parametrize("requests", [500, 4000])
def test_a_server_at_its_capacity_resolves_the_bound_and_below_it_finer(requests: int) -> None:
    """A server at its capacity is the random walk `resolution_bound` assumes: its runs' resolutions
    average to the bound (within 15%: the walk's variance is estimated with 8 degrees of freedom)."""

    def mean_resolution(offered: float) -> float:
        tests = [steadiness(*queue(offered, 10.0, requests, seed)) for seed in range(40)]
        return statistics.mean(t.resolution_qps for t in tests if t is not None)

    assert mean_resolution(10.0) == pytest.approx(resolution_bound(10.0, requests), rel=0.15)
    assert mean_resolution(8.0) < resolution_bound(8.0, requests)


def test_unfinished_requests_never_leave() -> None:
    arrivals = [i / 10 for i in range(400)]
    ends = [a + 1 for a in arrivals[:200]]  # the second half never ends
    test = steadiness(arrivals, ends)
    assert test is not None and not test.kept_up and test.served_qps == pytest.approx(0, abs=0.2)


def test_too_few_requests_or_no_span_is_no_test() -> None:
    assert steadiness([float(i) for i in range(MIN_REQUESTS - 1)], []) is None
    assert steadiness([1.0] * 100, [2.0] * 100) is None


def test_seeds_pool_into_the_mean_growth_and_its_standard_error() -> None:
    both = pooled([Steadiness(10.0, 1.0, 0.3, 500), Steadiness(12.0, -1.0, 0.4, 500)])
    assert (both.offered_qps, both.growth_qps) == (11.0, 0.0) and both.growth_se == pytest.approx(0.25)


def test_requests_needed_grows_as_the_square_of_the_resolution_wanted() -> None:
    assert requests_needed(500, 2.0, 0.1) == 200_000
    assert requests_needed(4000, 0.68, 0.1) == 190_000  # 184,960, two figures, rounded up
    assert requests_needed(4000, 0.05, 0.1) == 4000
