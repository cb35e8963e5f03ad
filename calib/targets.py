"""Observed load-curve points that `sangam fit` fits a testbed to, read from a CSV file.

Columns: layout, policy, model, trace, budget, qps, metric, value, weight, and optionally quote (the
sentence a published point comes from). `metric` is a summary statistic (`mean_e2el_s`, `p99_e2el_ms`,
see `calib.points.metric`); `weight` its share of the objective.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from calib.points import PointKey
from sangam.budget import Policy
from sangam.hardware import lookup_model
from sangam.layout import parse_mode
from sangam.workload import MASK_LEN

COLUMNS = ("layout", "policy", "model", "trace", "budget", "qps", "metric", "value", "weight")


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
    if budget <= 0 or not qps > 0 or not value > 0 or not weight > 0:
        raise ValueError("budget, qps, value and weight must be positive")
    key = PointKey(layout, policy.value, model, trace, budget, qps)
    return Target(key, row["metric"].strip(), value, weight, (row.get("quote") or "").strip())


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
