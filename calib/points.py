"""One simulated point on a testbed, and the metrics read from its summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiles.testbed import Testbed
from runs.config import RunConfig, RunFiles, synthetic_rows
from sangam.budget import Policy
from sangam.cost import TimeScales
from sangam.layout import parse_mode
from sim.points import run_points
from sim.run import SimResult
from sim.setup import Resolver

MAX_GPUS = 8  # the paper's node


@dataclass(frozen=True, slots=True)
class PointKey:
    """What names a point of a load curve: layout, policy, model, trace, budget tau and rate."""

    layout: str
    policy: str
    model: str
    trace: str
    budget: int
    qps: float

    def config(self, num_requests: int, seed: int) -> RunConfig:
        workers = parse_mode(self.layout, MAX_GPUS).num_workers
        return RunConfig(
            mode=self.layout,
            gpus=workers,
            model=self.model,
            trace=self.trace,
            budget=self.budget,
            policy=Policy(self.policy),
            qps=self.qps,
            num_requests=num_requests,
            seed=seed,
        )

    def label(self) -> str:
        return f"{self.layout} {self.policy} {self.model} {self.trace} tau={self.budget} qps={self.qps:g}"


class PointRunner:
    """Simulates points on one testbed (its GPU, profile, pages, arrivals, link and control delay),
    loading each model's profile once."""

    def __init__(self, testbed: Testbed) -> None:
        self._resolver = Resolver(testbed)

    def run(self, cfg: RunConfig, progress: str | None = None, scales: TimeScales | None = None) -> SimResult:
        """`cfg` on the testbed with forwards per block `progress` and its profile's times scaled by
        `scales` (defaults: the testbed's for the model and trace). Lengths and arrivals come from
        `cfg.seed`, so two runs that differ only in `progress` or `scales` see the same requests, and the
        same uniforms draw their forwards (common random numbers)."""
        setup = self._resolver.resolve(cfg, progress=progress, scales=scales)
        points = [(setup.config, synthetic_rows(setup.config))]
        files = RunFiles(progress=setup.progress)
        (result,) = run_points(points, setup.cost, setup.cost_name, setup.options, files)
        return result


def metric(summary: dict[str, Any], name: str) -> float:
    """A summary statistic by name: a summary key (`mean_e2el_ms`), or one in seconds (`mean_e2el_s`)."""
    key = name[: -len("_s")] + "_ms" if name.endswith("_s") else name
    if key not in summary:
        raise ValueError(f"unknown metric {name!r}: use a summary.json key, e.g. mean_e2el_ms or p99_e2el_s")
    value = float(summary[key])
    return value / 1000 if name.endswith("_s") else value
