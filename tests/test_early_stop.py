"""A search's probe stopped early (`sim.early_stop`): the bound never exceeds the run's final statistic,
an overloaded probe stops long before its end and fails for sure, a feasible one runs to the end
unchanged, the search's answer is the same with and without stopping, and the cache keeps stopped and
whole runs apart."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from profiles.analytic import AnalyticCostModel
from runs.config import RunConfig, synthetic_rows
from runs.results import request_row, summarize
from sangam.faults import parse_failures
from sangam.hardware import lookup_gpu, lookup_model
from sim.early_stop import STATS, EarlyStop, Exceeds, latency_bounds
from sim.options import SimOptions
from sim.run import simulate
from sim.search import SearchOptions, Slo, parse_slo, search
from sim.sweep import Cache, Point, evaluate, run_point
from tests.factories import make_request

ANALYTIC = SimOptions(cost="analytic")


def point(mode: str, qps: float, requests: int = 400, stop: tuple[Exceeds, ...] = ()) -> Point:
    return Point(RunConfig(mode=mode, qps=qps, num_requests=requests), ANALYTIC, stop=stop)


def in_process(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, p in enumerate(points):
        yield i, run_point(p)


LATENCIES = st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 50)), min_size=1, max_size=60)


@given(LATENCIES, st.floats(0, 200))
def test_every_statistic_of_the_bounds_is_at_most_the_final_one(
    requests: list[tuple[float, float]], now: float
) -> None:
    """Requests (arrival, final latency) seen at `now`, those that end by then ended: the statistic over
    the bounds never exceeds the one over the final latencies."""
    reqs = []
    for i, (arrival, latency) in enumerate(requests):
        req = make_request(i, 64, arrival=arrival)
        if arrival + latency <= now:
            req.end_block(arrival + latency)
        reqs.append(req)
    bounds = latency_bounds(reqs, now)
    final = sorted(latency for _, latency in requests)
    for stat in STATS:
        rule = Exceeds(stat, 0.0)
        assert rule.bound_ms(bounds) <= rule.bound_ms(final) * (1 + 1e-9)


@given(LATENCIES, st.sampled_from(STATS), st.floats(1, 60))
def test_told_of_each_end_it_stops_exactly_when_the_bound_exceeds_the_limit(
    requests: list[tuple[float, float]], stat: str, limit_s: float
) -> None:
    """The quick test between two ends never hides a stop: at every end, `ended` says True exactly
    when the statistic over every request's bound exceeds the limit."""
    reqs = [make_request(i, 64, arrival=arrival) for i, (arrival, _) in enumerate(requests)]
    rule = Exceeds(stat, 1000 * limit_s)
    watch = EarlyStop([rule], reqs)
    for req, (arrival, latency) in sorted(zip(reqs, requests, strict=True), key=lambda p: sum(p[1])):
        now = arrival + latency
        req.end_block(now)
        exact = rule.bound_ms(latency_bounds(reqs, now)) > rule.limit_ms
        assert watch.ended(req, now) == exact


def test_a_probe_that_meets_its_slo_looks_at_every_request_only_where_it_might_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks = []
    monkeypatch.setattr("sim.early_stop.latency_bounds", lambda reqs, now: looks.append(now) or [])
    run_point(point("2C", 1.0, stop=(Exceeds("p99", 20_000.0), Exceeds("mean", 20_000.0))))
    assert looks == []  # 400 ends, none near the limits: never the whole scan


def test_an_overloaded_probe_stops_early_and_would_have_failed() -> None:
    cfg = RunConfig(mode="1C", qps=4.0, num_requests=400)  # 1C serves about 1.8 requests/s
    cost = AnalyticCostModel(lookup_model(cfg.model), lookup_gpu(cfg.gpu))
    rows = synthetic_rows(cfg)
    whole = simulate(cfg, rows, cost)
    rule = Exceeds("p99", 20_000.0)
    stopped = simulate(cfg, rows, cost, stop=[rule])
    assert whole.summary["p99_e2el_ms"] > 20_000.0  # it does fail
    assert "stopped_at_s" not in whole.summary
    assert stopped.summary["stopped_at_s"] < whole.summary["duration"] / 2
    assert stopped.summary["completed"] < 400 / 2
    assert 20_000.0 < stopped.summary["lower_bounds"]["p99_e2el_ms"] <= whole.summary["p99_e2el_ms"]


def test_a_feasible_probe_runs_to_the_end_with_the_same_summary() -> None:
    plain = run_point(point("2C", 1.0))
    watched = run_point(point("2C", 1.0, stop=(Exceeds("p99", 20_000.0), Exceeds("mean", 20_000.0))))
    assert "stopped_at_s" not in watched and watched["completed"] == 400
    assert {k: v for k, v in watched.items() if k != "sim_wall_s"} == {
        k: v for k, v in plain.items() if k != "sim_wall_s"
    }


def test_only_monotone_latency_statistics_stop_a_probe() -> None:
    assert parse_slo("p99_e2el_s=20").stop_rule(2) == Exceeds("p99", 40_000.0)  # the mean of two seeds
    assert parse_slo("mean_e2el_s=3").stop_rule(1) == Exceeds("mean", 3_000.0)
    assert parse_slo("std_e2el_s=3").stop_rule(1) is None  # a spread can shrink
    assert parse_slo("p99_queue_s=3").stop_rule(1) is None  # only end-to-end latency has a bound
    assert parse_slo("overflow_rate=0.1").stop_rule(1) is None
    with pytest.raises(ValueError, match="cannot bound the std"):
        Exceeds("std", 1.0)


def test_the_search_answer_is_the_same_without_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = [point("1C", 1.0), point("2C", 1.0)]
    slos = [parse_slo("p99_e2el_s=20")]
    options = SearchOptions(granularity=0.2)
    early = search(configs, slos, [0], in_process, Cache(None), options)
    monkeypatch.setattr(Slo, "stop_rule", lambda self, seeds: None)
    whole = search(configs, slos, [0], in_process, Cache(None), options)
    assert [a.max_qps for a in early] == [a.max_qps for a in whole]
    assert [[(q, ok) for q, ok, _ in a.probes] for a in early] == [
        [(q, ok) for q, ok, _ in a.probes] for a in whole
    ]
    assert early[0].max_qps > early[1].max_qps > 0  # 2C first


def test_the_cache_keeps_stopped_runs_apart_from_whole_ones(tmp_path: Any) -> None:
    cache = Cache(tmp_path)
    rule = (Exceeds("p99", 20_000.0),)
    overloaded, feasible = point("1C", 4.0, stop=rule), point("1C", 0.5, stop=rule)
    first = evaluate([overloaded, feasible], in_process, cache)
    assert "stopped_at_s" in first[0] and "stopped_at_s" not in first[1]
    ran: list[Point] = []

    def counting(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        ran.extend(points)
        yield from in_process(points)

    whole = [dataclasses.replace(p, stop=()) for p in (overloaded, feasible)]
    again = evaluate(whole, counting, cache)
    assert ran == [whole[0]]  # the stopped run is no answer for the whole point; the feasible one is
    assert "stopped_at_s" not in again[0] and again[1] == first[1]
    assert evaluate([overloaded, feasible], counting, cache) == first and len(ran) == 1


def test_summaries_of_a_stopped_run_cover_the_requests_ended_by_then() -> None:
    cfg = RunConfig(mode="1C", qps=4.0, num_requests=400)
    cost = AnalyticCostModel(lookup_model(cfg.model), lookup_gpu(cfg.gpu))
    result = simulate(cfg, synthetic_rows(cfg), cost, stop=[Exceeds("mean", 10_000.0)])
    done = [request_row(r) for r in result.requests if r.finished]
    assert all(row["end"] <= result.summary["stopped_at_s"] for row in done)
    expected = summarize(done, cfg.kv_bytes_per_token)
    assert result.summary["mean_e2el_ms"] == expected["mean_e2el_ms"]
    assert result.summary["completed"] == len(done) < 400


def test_a_run_that_may_stop_cannot_also_lose_workers() -> None:
    cfg = RunConfig(mode="2C", qps=1.0, num_requests=20)
    cost = AnalyticCostModel(lookup_model(cfg.model), lookup_gpu(cfg.gpu))
    with pytest.raises(ValueError, match="cannot also lose workers"):
        simulate(cfg, synthetic_rows(cfg), cost, stop=[Exceeds("p99", 1.0)], failures=parse_failures("1@1"))


def test_a_stopped_probe_shows_its_latency_bound_and_no_other_metric() -> None:
    slos = [parse_slo("p99_e2el_s=20"), parse_slo("mean_queue_s=5")]
    (answer,) = search([point("1C", 1.0)], slos, [0], in_process, Cache(None), SearchOptions(start_qps=4))
    stopped = answer.probes[0]  # 4 QPS, twice what 1C serves
    assert stopped[0] == 4.0 and not stopped[1]
    assert stopped[2]["p99_e2el_s=20"] > 20_000 and math.isnan(stopped[2]["mean_queue_s=5"])
    passed = [values for _, ok, values in answer.probes if ok]
    assert passed and all(not math.isnan(v["mean_queue_s=5"]) for v in passed)
