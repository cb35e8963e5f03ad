"""A run's summary.json as the calibration commands read it back (`runs.live_summary`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.main import main
from profiles.store import DATA
from runs.live_summary import check_measured, run_config

GPU_RUN = {"model": "llada-8b", "live_model": "llada-8b", "gpu": "h200", "devices": ["cuda:0"]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "no 'config' object: not the summary of a sangam run"),
        ('{"config": null}', "no 'config' object"),
        ("{not json", "not a run's summary (Expecting property name"),
    ],
)
def test_a_summary_without_a_config_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(f'{tmp_path}/summary.json: {message}')}"):
        run_config(tmp_path)  # was an AttributeError in fit --blocks, validate and profile --from-log


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"live_model": "tiny-llada", "devices": ["cpu"]}, "its run served tiny-llada, not llada-8b"),
        ({"devices": ["cpu", "cpu"]}, r"its run was on CPU workers \(cpu, cpu\), not h200 GPUs"),
    ],
)
def test_a_run_that_timed_no_gpu_is_refused_as_a_measurement(change: dict[str, object], message: str) -> None:
    check_measured(GPU_RUN, "run")
    with pytest.raises(ValueError, match=f"^run: {message}"):
        check_measured({**GPU_RUN, **change}, "run")


def test_fit_loop_and_profile_from_log_refuse_a_tiny_models_cpu_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny CPU twin's times once went into an H200 testbed and profile without a word."""
    run = tmp_path / "run"
    run.mkdir()
    log = run / "iterations.csv"
    log.write_text("worker,start,end,gpu_s,items,cycle_s\n0,0,0.001,0.001,d:32:64,0.002\n")
    config = {**GPU_RUN, "live_model": "tiny-llada", "devices": ["cpu"]}
    (run / "summary.json").write_text(json.dumps({"config": config}))
    base = tmp_path / "base.json"  # a testbed of ours without a loop
    assert (
        main(
            ["fit", "--profile", str(DATA / "h200-fp8-kvfp8"), "--testbed", "sangam-h200", "--out", str(base)]
        )
        == 0
    )
    capsys.readouterr()
    out = ["--out", str(tmp_path / "out")]
    assert main(["fit", "--loop", str(run), "--testbed", str(base), *out]) == 2
    assert "its run served tiny-llada, not llada-8b" in capsys.readouterr().err
    assert main(["profile", "--model", "llada-8b", "--gpu", "h200", "--from-log", str(log), *out]) == 2
    assert "its run served tiny-llada, not llada-8b" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"partial": True}, "a run that stopped early or completed nothing"),
        ({"completed": 0}, "a run that stopped early or completed nothing"),
        ({"mean_e2el_ms": -5.0}, "mean_e2el_ms must be a number of 0 or more, got -5.0"),
        ({"p99_e2el_ms": "slow"}, "p99_e2el_ms must be a number of 0 or more, got 'slow'"),
    ],
)
def test_validate_refuses_a_live_summary_it_cannot_compare(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    """Such a row once left the report without a word (NaN, negative, missing) or was a TypeError."""
    from calib.validate import read_summary

    summary = {"config": GPU_RUN, "completed": 10, "mean_e2el_ms": 900.0, "p99_e2el_ms": 2000.0}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert read_summary(tmp_path)["completed"] == 10
    (tmp_path / "summary.json").write_text(json.dumps({**summary, **change}))
    with pytest.raises(ValueError, match=re.escape(message)):
        read_summary(tmp_path)
