"""Factories for CPU tests: requests with exact sequence lengths and planned forwards, a sweep engine
that runs nothing, or one whose runs stop keeping up above a rate."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from runs.config import RunConfig
from sangam.batcher import Batcher
from sangam.budget import BatchConfig, Policy
from sangam.kv import PagePool
from sangam.request import Request
from sim.steady import Steadiness
from sim.sweep import Point, Runner


def make_request(rid: int, seq_len: int, *, arrival: float = 0.0, steps: tuple[int, ...] = (32,)) -> Request:
    """A request whose prefills run over exactly `seq_len` tokens (no mask buffer)."""
    return Request(rid, arrival, seq_len, 32 * len(steps), 0, steps)


def make_batcher(
    budget: int = 1024,
    *,
    pages: int = 100_000,
    policy: Policy = Policy.DEFICIT,
    max_decodes: int = 64,
    hand_off: bool = False,
) -> Batcher:
    return Batcher(0, BatchConfig(policy, budget, max_decodes), PagePool(pages), hand_off=hand_off)


def seat_decodes(batcher: Batcher, n: int, *, first_id: int = 1000, seq_len: int = 64) -> list[Request]:
    """Put `n` requests straight into the batcher's decode set (as if prefilled earlier)."""
    reqs = [make_request(first_id + i, seq_len, arrival=-1.0) for i in range(n)]
    for req in reqs:
        batcher.pool.allocate(req.id, req.pages)
        req.step = 1
        batcher.add_decode(req)
    return reqs


def fake_runner(metric: Callable[[RunConfig], float]) -> Runner:
    """A runner whose summaries are `metric(point)` as mean_e2el_ms, in reverse order of the points."""

    def run(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        for i in reversed(range(len(points))):
            yield i, {"mean_e2el_ms": metric(points[i].config)}

    return run


def backlog_runner(capacity: float) -> Runner:
    """A runner whose summaries meet any latency SLO (mean_e2el_ms 1) in runs of 500 requests, the
    number in the system growing by the rate less `capacity` (standard error 0.1), if positive."""

    def run(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, point in enumerate(points):
            qps = point.config.qps
            test = Steadiness(qps, max(0.0, qps - capacity), 0.1, 500)
            yield i, {"mean_e2el_ms": 1.0, "completed": 500, **test.summary()}

    return run


def rounded(value: Any, digits: int) -> Any:
    """`value` with every float rounded to `digits` significant digits, through dicts and lists."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item, digits) for item in value]
    return value
