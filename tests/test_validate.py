"""`sangam validate --live-results` over the live runs shipped in benchmarks/results: the simulator, as it
is now, still gives the errors of the shipped reports that docs/calibration.md quotes; and its bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
# report -> the directory of its live runs
COLOCATED = {
    "validate-llada-8b-h200-colocated.json": "live-colocated-llada-8b-h200",
    "validate-llada-8b-h200-colocated-recheck.json": "recheck-colocated-llada-8b-h200",
    # on sangam-h200-fp8 v2, profiled (piecewise graphs, attention into their static rows, Triton prefill)
    # in the live runs' call, its worker loop measured in the -10 runs. The earlier FP8 reports were
    # simulated on the FP8 profiles of their day,
    # profiles/data/h200-fp8-kvfp8 at fe3c27d for validate-llada-8b-h200-colocated-fp8.json, at 3f956a3 for
    # ...-fp8-seed1[34].json, at fa1e503 for ...-fp8-[345]-seed1[34].json, at 054519f for
    # ...-fp8-6-seed1[34].json, at 330f859 for ...-fp8-7-seed1[34].json, at 7a0def5 for
    # ...-fp8-8-seed1[34].json, at 9e650d6 for ...-fp8-9-seed1[34].json and at d141cc9 for
    # ...-fp8-10-*.json
    **{
        f"validate-llada-8b-h200-colocated-fp8-11-{run}.json": f"live-colocated-fp8-llada-8b-h200-11/{run}"
        for run in ("seed13", "seed14", "seed15")
    },
}
SHARED_GPU = {  # simulated with the profiles of their day (docs/calibration.md): only the link figures hold
    "validate-llada-8b-h200-1P1C-shared-gpu.json": "live-1p1c-llada-8b-h200",
    "validate-dream-7b-h200-1P1C-shared-gpu.json": "live-1p1c-dream-7b-h200",
}


def revalidate(report: str, live: str, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The shipped report's points and those of `sangam validate` run again on its live runs (on the
    testbed its simulated runs name; reports older than testbeds name none)."""
    shipped = json.loads((RESULTS / report).read_text())
    cfg, link = shipped[0]["live"]["config"], shipped[0]["sim"]["kv_link"]["source"]
    testbed = shipped[0]["sim"].get("testbed")
    args = [
        "validate", "--mode", cfg["layout"], "--model", cfg["model"], "--gpu", cfg["gpu"],
        "--gpus", str(len(set(cfg["devices"]))), "--num-requests", str(cfg["num_requests"]),
        "--seed", str(cfg["seed"]), "--qps", *(f"{p['qps']:g}" for p in shipped),
        "--live-results", str(RESULTS / live), "--out", str(out), "--report", str(out / report),
    ]  # fmt: skip
    args += ["--link", link] if link != "assumed" else []
    assert main([*args, *(["--testbed", testbed] if testbed else [])]) == 0
    return shipped, json.loads((out / report).read_text())


@pytest.mark.parametrize(("report", "live"), COLOCATED.items())
def test_the_colocated_reports_are_what_the_simulator_gives(report: str, live: str, tmp_path: Path) -> None:
    shipped, again = revalidate(report, live, tmp_path)
    assert [p["qps"] for p in again] == [p["qps"] for p in shipped]
    for old, new in zip(shipped, again, strict=True):
        assert new["error_pct"] == pytest.approx(old["error_pct"], abs=0.01)
        # the simulator holds the live run's KV pages in the live run's dtype (FP8 for the FP8 run)
        live_kv = new["live"]["config"].get("kv_cache_dtype", "auto")
        assert new["sim"]["config"]["kv_cache_dtype"] == live_kv


def test_the_recheck_meets_the_fidelity_goal(tmp_path: Path) -> None:
    report = "validate-llada-8b-h200-colocated-recheck.json"
    (point,) = revalidate(report, COLOCATED[report], tmp_path)[1]
    assert abs(point["error_pct"]["mean_e2el_ms"]) <= 3 and abs(point["error_pct"]["p99_e2el_ms"]) <= 5


@pytest.mark.parametrize(("report", "live"), SHARED_GPU.items())
def test_the_shared_gpu_transfer_figures_still_hold(report: str, live: str, tmp_path: Path) -> None:
    shipped, again = revalidate(report, live, tmp_path)
    for old, new in zip(shipped, again, strict=True):
        for key in ("mean_transfer_ms", "p99_transfer_ms"):
            assert new["error_pct"][key] == pytest.approx(old["error_pct"][key], abs=0.01)


def test_a_rate_with_no_live_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live = RESULTS / COLOCATED["validate-llada-8b-h200-colocated.json"]  # runs at 0.8 and 1 QPS
    args = ["validate", "--mode", "colocated", "--model", "llada-8b", "--gpu", "h200", "--qps", "0.9"]
    assert main([*args, "--live-results", str(live), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no live run at 0.9 QPS" in err and err.count("\n") == 1


def test_validate_without_the_gpus_it_asks_for_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from executor.run import live

    monkeypatch.setattr(live, "visible_gpus", lambda: 0)  # as on a machine without GPUs, wherever it runs
    args = ["validate", "--gpus", "2", "--mode", "2C", "-n", "5", "--out", str(tmp_path / "v")]
    assert main([*args, "--report", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs 2C live on 2 GPUs (--gpus), 0 visible; --live-results DIR" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("change", "needle"),
    [(["--num-requests", "30"], "num_requests 300"), (["--model", "dream-7b"], "model 'llada-8b'")],
)
def test_live_runs_of_other_arguments_are_refused(
    change: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = RESULTS / COLOCATED["validate-llada-8b-h200-colocated-recheck.json"]  # 300 requests at 1 QPS
    args = [
        "validate",
        "--mode",
        "colocated",
        "--model",
        "llada-8b",
        "--gpu",
        "h200",
        "--num-requests",
        "300",
    ]
    assert main([*args, *change, "--qps", "1", "--live-results", str(live), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"the live run has {needle}" in err and err.count("\n") == 1


def test_the_report_table_is_readable_at_80_columns() -> None:
    """Every compared metric of a disaggregated report at three loads, on an 80-column console: no line
    wider, and every number whole."""
    import io

    from rich.console import Console

    from calib.validate import print_report

    shipped = json.loads((RESULTS / "validate-dream-7b-h200-1P1C-shared-gpu.json").read_text())
    points = [{**shipped[0], "load": load, "qps": qps} for load, qps in (("low", 0.3), ("medium", 0.6),
                                                                          ("near knee", 0.9))]  # fmt: skip
    console = Console(width=80, file=io.StringIO(), record=True)
    print_report(points, RESULTS / "report.json", console)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    words = set(" ".join(lines).split())
    for key, error in points[0]["error_pct"].items():
        live, sim = points[0]["live"][key] / 1000, points[0]["sim"][key] / 1000
        assert {f"{live:.2f}", f"{sim:.2f}", f"({error:+.1f}%)"} <= words, key
