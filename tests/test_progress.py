"""Progress models: forwards per block."""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sangam.progress import (
    DEFAULT_PROGRESS,
    beta_binomial,
    default_progress,
    empirical,
    fixed,
    parse_progress,
    uniform,
)


def moments(model_values: tuple[int, ...], cdf: tuple[float, ...]) -> tuple[float, float]:
    probs = [b - a for a, b in zip((0.0, *cdf), cdf, strict=False)]
    mean = sum(v * p for v, p in zip(model_values, probs, strict=True))
    var = sum((v - mean) ** 2 * p for v, p in zip(model_values, probs, strict=True))
    return mean, math.sqrt(var)


@pytest.mark.parametrize(("mean", "std"), [*DEFAULT_PROGRESS.values(), (4.0, 2.0), (25.0, 4.0)])
def test_beta_binomial_has_the_requested_mean_and_spread(mean: float, std: float) -> None:
    model = beta_binomial(mean, std)
    got_mean, got_std = moments(model.values, model.cdf)
    assert got_mean == pytest.approx(mean, rel=1e-9)
    assert got_std == pytest.approx(std, rel=1e-9)
    assert model.values == tuple(range(1, 33))


def test_draws_follow_the_distribution() -> None:
    model = beta_binomial(10.0, 5.0)
    rng = random.Random(0)
    draws = [model.draw(rng) for _ in range(40_000)]
    assert sum(draws) / len(draws) == pytest.approx(10.0, rel=0.02)
    assert min(draws) >= 1 and max(draws) <= 32


def test_fixed_uniform_and_empirical() -> None:
    rng = random.Random(1)
    assert {fixed(7).draw(rng) for _ in range(50)} == {7}
    assert {uniform(3, 5).draw(rng) for _ in range(300)} == {3, 4, 5}
    samples = [2, 2, 2, 9]
    emp = empirical(samples)
    draws = [emp.draw(rng) for _ in range(4000)]
    assert set(draws) == {2, 9} and draws.count(2) / len(draws) == pytest.approx(0.75, abs=0.03)
    assert emp.mean == pytest.approx(3.75)


def test_plan_is_seeded() -> None:
    model = default_progress("llada-8b", "sharegpt")
    assert model.plan(50, random.Random(9)) == model.plan(50, random.Random(9))


@given(st.integers(1, 32))
def test_parse_fixed_round_trips(d: int) -> None:
    assert parse_progress(f"fixed:{d}").values == (d,)


@pytest.mark.parametrize(
    "spec",
    [
        "fixed:0",
        "fixed:33",
        "uniform:9:3",
        "betabinom:1:2",
        "betabinom:10:0.1",
        "betabinom:10:40",
        "magic:3",
        "fixed",
    ],
)
def test_bad_specs_are_rejected_with_a_reason(spec: str) -> None:
    with pytest.raises(ValueError, match=r"progress|forwards|spread|mean|lo"):
        parse_progress(spec)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("uniform:nan:inf", "'nan' is not a whole number"),
        ("fixed:8.5", "'8.5' is not a whole number"),
        ("counts:4=x", "'x' is not a whole number"),
        ("betabinom:nan:2", "'nan' is not a finite number"),
        ("betabinom:8:inf", "'inf' is not a finite number"),
        ("betabinom:eight:2", "'eight' is not a number"),
    ],
)
def test_a_value_that_is_not_a_number_of_its_kind_is_named(spec: str, reason: str) -> None:
    """Python's own wording ("invalid literal for int() with base 10") once reached the explorer's page."""
    with pytest.raises(ValueError, match=f"^bad progress model '{re.escape(spec)}': {re.escape(reason)}$"):
        parse_progress(spec)


def test_counts_are_weights_not_samples() -> None:
    """A count of 10^8 was once a list of 10^8 samples (7 s, 812 MB); 10^23 never finished."""
    assert parse_progress("counts:3=5,1=2,7=0,5=1") == empirical([3] * 5 + [1] * 2 + [5])
    assert parse_progress("counts:1=1000000000000,4=1").mean == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"counts must lie in \[0, 9007199254740992\]"):
        parse_progress("counts:1=99999999999999999999999")
    with pytest.raises(ValueError, match="forwards 1 counted twice"):
        parse_progress("counts:1=2,1=3")


def test_default_exists_for_every_model_and_trace() -> None:
    for model, trace in DEFAULT_PROGRESS:
        assert 1 < default_progress(model, trace).mean < 32
