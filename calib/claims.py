"""The numbers and orderings the paper states in sections 3.3 and 6 (`calib/data/paper-claims.csv`),
each beside the simulated value.

A claim names a point (`LAYOUT/POLICY/MODEL/TRACE/TAU/QPS`) and a metric (`calib.points.metric`; `A|B`
gives the versus point its own metric). Kinds: `value` (the paper's number), `below` (under the
paper's bound), `ratio` (the point's metric over the versus point's) and `less` (the point's metric
below the versus point's: a stated ordering).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calib.points import PointKey, metric

CLAIMS = Path(__file__).parent / "data" / "paper-claims.csv"
KINDS = ("value", "below", "ratio", "less")


def parse_point(text: str) -> PointKey:
    """`5P3D/deficit/llada-8b/sharegpt/1024/6.5`."""
    parts = text.split("/")
    if len(parts) != 6:
        raise ValueError(f"bad point {text!r}: use LAYOUT/POLICY/MODEL/TRACE/TAU/QPS")
    layout, policy, model, trace, budget, qps = parts
    return PointKey(layout, policy, model, trace, int(budget), float(qps))


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    section: str
    kind: str
    point: PointKey
    versus: PointKey | None
    metric: str
    value: float | None  # the paper's number (None for a bare ordering)
    quote: str

    @property
    def metrics(self) -> tuple[str, str]:
        first, _, second = self.metric.partition("|")
        return first, second or first

    @property
    def figure(self) -> str:
        """The figure the claim is read from: its id's first part (`fig9` for `9-coloc-7.5`)."""
        return "fig" + self.id.split("-")[0]

    @property
    def points(self) -> list[PointKey]:
        return [self.point] if self.versus is None else [self.point, self.versus]


def read_claims(path: Path = CLAIMS) -> list[Claim]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    claims = []
    for line, row in enumerate(rows, start=2):
        if row["kind"] not in KINDS:
            raise ValueError(f"{path}, line {line}: kind must be one of {', '.join(KINDS)}")
        versus = parse_point(row["versus"]) if row["versus"] else None
        if (row["kind"] in ("ratio", "less")) != (versus is not None):
            need = "needs" if versus is None else "takes no"
            raise ValueError(f"{path}, line {line}: a {row['kind']} claim {need} versus")
        value = float(row["value"]) if row["value"] else None
        point = parse_point(row["point"])
        claims.append(
            Claim(row["id"], row["section"], row["kind"], point, versus, row["metric"], value, row["quote"])
        )
    return claims


@dataclass(frozen=True, slots=True)
class Outcome:
    claim: Claim
    simulated: float  # the point's metric, or its ratio to the versus point's
    versus: float | None  # the versus point's metric
    ratio: float | None  # simulated over the paper's number
    holds: bool | None  # for `below` and `less`


def judge(claim: Claim, summaries: Mapping[PointKey, dict[str, Any]]) -> Outcome:
    """The claim against the simulated summaries of its points."""
    first, second = claim.metrics
    a = metric(summaries[claim.point], first)
    b = metric(summaries[claim.versus], second) if claim.versus is not None else None
    simulated = a / b if claim.kind == "ratio" and b else a
    ratio = simulated / claim.value if claim.value else None
    holds = None
    if claim.kind == "below":
        holds = claim.value is not None and a < claim.value
    elif claim.kind == "less":
        holds = b is not None and a < b
    return Outcome(claim, simulated, b, ratio, holds)


COLUMNS = ("id", "section", "kind", "point", "versus", "metric", "paper", "simulated", "versus_simulated",
           "ratio", "holds", "quote")  # fmt: skip


def outcome_row(o: Outcome) -> dict[str, Any]:
    c = o.claim
    return {
        "id": c.id,
        "section": c.section,
        "kind": c.kind,
        "point": c.point.label(),
        "versus": c.versus.label() if c.versus else "",
        "metric": c.metric,
        "paper": "" if c.value is None else f"{c.value:g}",
        "simulated": f"{o.simulated:.4g}",
        "versus_simulated": "" if o.versus is None else f"{o.versus:.4g}",
        "ratio": "" if o.ratio is None else f"{o.ratio:.2f}",
        "holds": "" if o.holds is None else ("yes" if o.holds else "no"),
        "quote": c.quote,
    }


def write_outcomes(outcomes: list[Outcome], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(outcome_row(o) for o in outcomes)
