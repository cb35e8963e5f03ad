"""Observed load-curve points that `sangam fit` fits a testbed to, read from a CSV file.

Columns: layout, policy, model, trace, budget, qps, metric, value, weight, and optionally quote (the
sentence a published point comes from). `metric` is a summary's latency statistic (`mean_e2el_s`,
`p99_e2el_ms`, see `calib.points.metric`) or rate (`request_throughput`); `weight` its share of the
objective.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from calib.points import PointKey
from runs.results import METRICS
from sangam.budget import Policy
from sangam.hardware import lookup_model
from sangam.layout import parse_mode
from sangam.workload import MASK_LEN

COLUMNS = ("layout", "policy", "model", "trace", "budget", "qps", "metric", "value", "weight")
# what a target may fit (`calib.points.metric`): the summary's latency statistics, in ms or s, and its rates
METRIC_NAMES = frozenset(
    [
        f"{stat}_{name}_{unit}"
        for stat in ("mean", "median", "p90", "p99", "std")
        for name in METRICS
        for unit in ("ms", "s")
    ]
    + ["request_throughput", "output_throughput", "total_token_throughput", "overflow_rate"]
)


@dataclass(frozen=True, slots=True)
class Target:
    """One observed point: the simulated `metric` of `key` should be `value`."""

    key: PointKey
    metric: str
    value: float
    weight: float
    quote: str = ""

    @property
    def pair(self) -> tuple[str, str]:
        return (self.key.model, self.key.trace)

    def label(self) -> str:
        return f"{self.key.label()} {self.metric}"


def parse_target(row: dict[str, str]) -> Target:
    """One row of a targets file; ValueError on a bad field."""
    missing = [c for c in COLUMNS if row.get(c) is None]
    if missing:
        raise ValueError(f"the row has no {missing[0]} (a short row)")
    policy = Policy(row["policy"].strip())
    model, trace = row["model"].strip(), row["trace"].strip()
    lookup_model(model)
    if trace not in MASK_LEN:
        raise ValueError(f"trace must be one of {', '.join(MASK_LEN)}, got {trace!r}")
    layout = row["layout"].strip()
    parse_mode(layout, 8)
    budget, qps, value, weight = (
        int(row["budget"]),
        float(row["qps"]),
        float(row["value"]),
        float(row["weight"]),
    )
    if budget <= 0 or not all(0 < x < math.inf for x in (qps, value, weight)):
        raise ValueError("budget, qps, value and weight must be positive and finite")
    name = row["metric"].strip()
    if name not in METRIC_NAMES:
        raise ValueError(f"metric must be a latency statistic (e.g. p99_e2el_s) or a rate, got {name!r}")
    key = PointKey(layout, policy.value, model, trace, budget, qps)
    return Target(key, name, value, weight, (row.get("quote") or "").strip())


def read_targets(path: Path) -> list[Target]:
    """Every target of a CSV file; ValueError naming the file and line of the first bad one."""
    try:
        return _read_targets(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason})") from None


def _read_targets(path: Path) -> list[Target]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(COLUMNS)})")
        targets = []
        for line, row in enumerate(reader, start=2):
            try:
                targets.append(parse_target(row))
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}, line {line}: {err}") from None
    if not targets:
        raise ValueError(f"{path}: no targets")
    return targets
