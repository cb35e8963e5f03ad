"""Golden results: the simulator's summaries and per-request rows of a few points, pinned exactly, so a
speed-up of sim/ or the core that changes any number fails here. A change meant to move results
regenerates the file (`PYTHONPATH=. python -m tests.test_golden --write`) and says why in its commit."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from runs.config import RunConfig, synthetic_rows
from runs.results import request_row
from sangam.faults import parse_failures

GOLDEN = Path(__file__).parent / "golden" / "sim_summaries.json"
CASES: dict[str, dict[str, Any]] = {
    "8C-sharegpt-analytic": {"mode": "8C", "qps": 7.5},
    "5P3D-sharegpt-analytic": {"mode": "5P3D", "qps": 7.5},
    "5P3C-sharegpt-analytic": {"mode": "5P3C", "qps": 9.0},
    "3P5C-arxiv-dream-analytic": {"mode": "3P5C", "qps": 5.0, "trace": "arxiv", "model": "dream-7b"},
    "8C-sharegpt-profile": {"mode": "8C", "qps": 7.5, "cost": "profile"},
    "5P3C-sharegpt-profile": {"mode": "5P3C", "qps": 8.0, "cost": "profile"},
    # the H200's measured profile: its decode-only replays priced by their graph buckets' own lines
    "2C-sharegpt-h200-profile": {"mode": "2C", "qps": 2.4, "gpu": "h200", "cost": "profile"},
    "fastdllm-4C-analytic": {"mode": "4C", "qps": 1.5, "policy": "fastdllm"},
    # each worker back 5 s after its loss: the restart's back-off of 1 s and a start-up of 4 s
    "3C-failure-restart-analytic": {"mode": "3C", "qps": 4.0, "fail": "1@20.01,2@40.01", "restart": 4.0},
}
REQUESTS = 600


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    from profiles.analytic import AnalyticCostModel
    from profiles.store import default_cost_model
    from sangam.hardware import lookup_gpu, lookup_model
    from sim.run import simulate

    args = {k: v for k, v in case.items() if k not in ("cost", "fail", "restart")}
    if "policy" in args:
        from sangam.budget import Policy

        args["policy"] = Policy(args["policy"])
    cfg = RunConfig(num_requests=REQUESTS, **args)
    if case.get("cost") == "profile":
        cost, _, _ = default_cost_model(cfg.model, cfg.gpu)
    else:
        cost = AnalyticCostModel(lookup_model(cfg.model), lookup_gpu(cfg.gpu))
    result = simulate(
        cfg,
        synthetic_rows(cfg),
        cost,
        failures=parse_failures(case["fail"]) if "fail" in case else (),
        restart_after_s=case.get("restart"),
    )
    summary = {k: v for k, v in result.summary.items() if k not in ("sim_wall_s", "build", "config")}
    rows = [repr(request_row(r)) for r in sorted(result.requests, key=lambda r: r.id) if r.finished]
    summary["requests_sha256"] = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    return summary


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_simulator_gives_the_pinned_results(name: str) -> None:
    expected = json.loads(GOLDEN.read_text())[name]
    assert run_case(CASES[name]) == expected


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps({name: run_case(c) for name, c in CASES.items()}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
