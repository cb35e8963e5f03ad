"""The results format: parts sum to end-to-end latency; summary keys; files."""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from factories import make_request
from test_sim import LinearCost, run_cluster

from runs.results import METRICS, REQUEST_COLUMNS, percentile, request_row, summarize, write_results


@pytest.mark.parametrize("mode", ["2C", "1P1D", "1P1C"])
def test_parts_sum_to_end_to_end(mode: str) -> None:
    rng = random.Random(2)
    reqs = [
        make_request(
            i, rng.randint(50, 800), arrival=i * 0.02, steps=tuple(rng.randint(1, 8) for _ in range(3))
        )
        for i in range(60)
    ]
    run_cluster(reqs, mode, cost=LinearCost(0.01, 1e-5), theta=500)
    for req in reqs:
        row = request_row(req)
        parts = row["prefill_queue"] + row["prefill"] + row["decode_queue"] + row["transfer"] + row["decode"]
        assert parts == pytest.approx(row["e2el"], abs=1e-9)
        assert row["queue"] == pytest.approx(row["prefill_queue"] + row["decode_queue"])
        if mode == "1P1D":  # every block that outlives its prefill moves its KV
            assert row["kv_transfers"] == sum(d > 1 for d in req.steps)
        if mode == "2C":
            assert row["kv_transfers"] == 0 and row["transfer"] == 0


def test_summary_has_vllm_style_keys_and_correct_percentiles(tmp_path: Path) -> None:
    reqs = [make_request(i, 100, arrival=float(i), steps=(2,)) for i in range(5)]
    run_cluster(reqs, "1C")
    rows = [request_row(r) for r in reqs]
    summary = summarize(rows, kv_bytes_per_token=2)
    for metric in METRICS:
        for stat in ("mean", "median", "p90", "p99"):
            assert f"{stat}_{metric}_ms" in summary
    e2e = sorted(r["e2el"] for r in rows)
    assert summary["median_e2el_ms"] == pytest.approx(1000 * e2e[2])
    assert summary["completed"] == 5 and summary["failed"] == 0
    mean = sum(e2e) / 5
    assert summary["std_e2el_ms"] == pytest.approx(1000 * (sum((v - mean) ** 2 for v in e2e) / 5) ** 0.5)
    duration = max(r["end"] for r in rows) - min(r["arrival"] for r in rows)
    assert summary["duration"] == pytest.approx(duration)
    assert summary["total_input_tokens"] == sum(r["prompt_len"] for r in rows) == 500
    assert summary["total_output_tokens"] == sum(r["output_len"] for r in rows)
    tokens = summary["total_input_tokens"] + summary["total_output_tokens"]
    assert summary["total_token_throughput"] == pytest.approx(tokens / duration)
    write_results(tmp_path, reqs, {"config": {"layout": "1C"}, **summary})
    with (tmp_path / "requests.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(REQUEST_COLUMNS) and len(table) == 5
    with (tmp_path / "blocks.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 5
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["layout"] == "1C"


def test_percentile_matches_linear_interpolation() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0


# The same fact under two names, as summary.json and sweep.csv held them before (issue 31 item 6).
ALIASES = {"duration_s": "duration", "mode": "layout", "pages": "kv_pages", "requests_failed": "failed",
           "sim_control_ms": "control_ms"}  # fmt: skip


def test_summary_json_names_each_fact_once(tmp_path: Path) -> None:
    from cli.main import main

    out = tmp_path / "run"
    assert main(["sim", "--mode", "colocated", "--gpus", "2", "-n", "20", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    keys = set(summary) | set(summary["config"])
    assert not keys & set(ALIASES), keys & set(ALIASES)
    assert {"duration", "failed", "control_ms"} <= set(summary)
    assert summary["config"]["layout"] == "2C" and summary["config"]["kv_pages"] > 0


def test_a_resolved_config_reads_back_as_written_before_and_after_one_name_per_fact() -> None:
    from calib.validate import live_pages
    from runs.config import RunConfig

    cfg = RunConfig(mode="colocated", gpus=2, qps=3.0, num_requests=20)
    new = json.loads(json.dumps(cfg.resolved(), default=str))
    old = {**new, "mode": "colocated", "pages": None}  # as files written before hold it
    for written in (new, old):
        back = RunConfig.from_resolved(written)
        assert back.layout == cfg.layout and back.kv_pages == cfg.kv_pages and back.qps == 3.0
    assert RunConfig.from_resolved(new, num_requests=5).num_requests == 5
    assert live_pages(new) == cfg.kv_pages and live_pages(old) is None  # None: the pool was not given
    assert live_pages({**old, "pages": 900}) == 900


def test_a_servers_summary_reads_back_with_the_budgets_its_layout_leaves_null() -> None:
    """`sangam serve`'s summary (executor/run/live.py `served`) names the served model and its shapes apart
    and leaves prefill_budget null for colocated layouts and theta for all but hybrid ones."""
    from runs.config import RunConfig

    written = json.loads(json.dumps(RunConfig(num_requests=5, budget=512).resolved(), default=str))
    nulls = {"prefill_budget": None, "theta": None}
    served = {**written, "model": "tiny-llada", "model_spec": "llada-8b", **nulls}
    back = RunConfig.from_resolved(served)
    assert (back.model, back.budget, back.prefill_budget, back.theta) == ("llada-8b", 512, 2048, 8192)
    with pytest.raises(TypeError, match=r"^budget must be int, got None$"):  # a null it needs is refused
        RunConfig.from_resolved({**served, "budget": None})
    with pytest.raises(ValueError, match=r"^mask length must be a positive multiple of 32 up to 2147483647"):
        RunConfig.from_resolved({**served, "mask_len": 2**32})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("budget", "1024", "budget must be int, got '1024'"),
        ("prefill_budget", 1e308, "prefill_budget must be int, got 1e+308"),
        ("qps", True, "qps must be int or float, got True"),
        ("layout", None, "layout must be str, got None"),
        ("kv_pages", [1], "kv_pages must be int or null, got [1]"),
        ("seed", "x", "seed must be int, got 'x'"),
    ],
)
def test_a_resolved_config_of_the_wrong_types_is_refused_by_name(key: str, value: Any, message: str) -> None:
    """summary.json is read back from files a user may have edited: each value must be of its field's kind."""
    from runs.config import RunConfig

    written = json.loads(json.dumps(RunConfig(num_requests=5).resolved(), default=str))
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        RunConfig.from_resolved({**written, key: value})
