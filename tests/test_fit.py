"""`sangam fit`: recovering a known forwards-per-block model, and a known time scale of one iteration kind,
from curves the simulator made, measuring forwards from a live run's blocks, and bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from calib.fit import dispersion, spread
from calib.points import PointKey, PointRunner, metric
from cli.main import main
from profiles.testbeds import load_testbed
from sangam.cost import IterationKind, TimeScales
from sangam.progress import parse_progress

TRUTH = "betabinom:14:6"  # the default testbed's LLaDA ShareGPT model has mean 10
POINTS = (("1C", "fastdllm", 0.2), ("1C", "fastdllm", 0.35), ("1C", "deficit", 1.0))
REQUESTS, SEED = 150, 3


def write_targets(path: Path, progress: str = TRUTH, scales: TimeScales | None = None) -> None:
    """Mean e2e of three points simulated on sangam-h100 with the `progress` model (and `scales`)."""
    sim = PointRunner(load_testbed("sangam-h100"))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["layout", "policy", "model", "trace", "budget", "qps", "metric", "value", "weight"])
        for layout, policy, qps in POINTS:
            key = PointKey(layout, policy, "llada-8b", "sharegpt", 1024, qps)
            value = metric(sim.run(key.config(REQUESTS, SEED), progress, scales).summary, "mean_e2el_s")
            out.writerow([layout, policy, "llada-8b", "sharegpt", 1024, qps, "mean_e2el_s", value, 1])


def test_fit_recovers_the_mean_of_the_model_that_made_the_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    targets, out = tmp_path / "targets.csv", tmp_path / "fitted.json"
    write_targets(targets)
    args = ["fit", "--targets", str(targets), "-n", str(REQUESTS), "--seed", str(SEED), "--out", str(out)]
    assert main([*args, "--name", "other"]) == 2
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "llada-8b sharegpt: forwards per block mean" in printed and "held out" in printed
    assert printed.count("mean_e2el_s") == len(POINTS)  # a residual row per point
    testbed = load_testbed(str(out))
    spec = testbed.progress_spec("llada-8b", "sharegpt")
    assert parse_progress(spec).mean == pytest.approx(parse_progress(TRUTH).mean, rel=0.10)
    base = load_testbed("sangam-h100")
    assert testbed.progress_spec("dream-7b", "arxiv") == base.progress_spec("dream-7b", "arxiv")
    assert testbed.gpu == base.gpu and testbed.profile_data == base.profile_data
    assert testbed.fit is not None
    points = testbed.fit["pairs"]["llada-8b/sharegpt"]["points"]
    assert len(points) == len(POINTS) and all(p["held_out"] is not None for p in points)
    assert "fitted by sangam fit" in testbed.progress[("llada-8b", "sharegpt")].source


def test_fit_recovers_the_decode_time_scale_that_made_the_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = load_testbed("sangam-h100")
    forwards = base.progress_spec("llada-8b", "sharegpt")
    targets, out = tmp_path / "targets.csv", tmp_path / "scaled.json"
    write_targets(targets, forwards, TimeScales(decode=1.3))
    args = ["fit", "--targets", str(targets), "-n", str(REQUESTS), "--seed", str(SEED), "--out", str(out)]
    assert main([*args, "--free", "none"]) == 2
    assert "--free none leaves nothing to fit" in capsys.readouterr().err
    assert main([*args, "--free", "none", "--scales", "decode"]) == 0
    printed = capsys.readouterr().out
    assert "llada-8b sharegpt: forwards per block kept" in printed
    assert "llada-8b: time scale per iteration kind decode 1.3" in printed
    assert printed.count("mean_e2el_s") == len(POINTS) and "held out" in printed
    testbed = load_testbed(str(out))
    assert testbed.scales("llada-8b").decode == pytest.approx(1.3, rel=0.01)
    assert testbed.scales("llada-8b").prefill == testbed.scales("llada-8b").mixed == 1.0
    assert testbed.scales("dream-7b") == TimeScales()
    assert testbed.progress == base.progress  # kept
    assert "fitted by sangam fit (none free, time scales of decode)" in (
        testbed.time_scales["llada-8b"][IterationKind.DECODE].source
    )
    assert testbed.fit is not None
    assert testbed.fit["time_scales"]["llada-8b"]["decode"] == pytest.approx(1.3, rel=0.01)
    points = testbed.fit["pairs"]["llada-8b/sharegpt"]["points"]
    assert all(p["held_out"] == pytest.approx(p["observed"], rel=0.02) for p in points)
    with targets.open() as f:  # the new testbed, simulated, gives the curves back
        first = next(csv.DictReader(f))
    key = PointKey("1C", "fastdllm", "llada-8b", "sharegpt", 1024, float(first["qps"]))
    summary = PointRunner(testbed).run(key.config(REQUESTS, SEED)).summary
    assert metric(summary, "mean_e2el_s") == pytest.approx(float(first["value"]), rel=0.01)


PREFILL_MS = {"sharegpt": 100.0, "arxiv": 300.0}


class FormulaRunner:
    """Stands in for the simulator: a model's prefill time is its prefill scale times a trace's constant,
    its decode time its decode scale times the trace's mean forwards per block."""

    def __init__(self, testbed: object) -> None:
        pass

    def run(self, cfg: Any, progress: str, scales: TimeScales) -> Any:
        mean = parse_progress(progress).mean
        summary = {
            "mean_prefill_ms": scales.prefill * PREFILL_MS[cfg.trace],
            "mean_decode_ms": scales.decode * mean * 10 * cfg.qps,
        }
        return SimpleNamespace(summary=summary)


def test_a_models_traces_share_its_time_scales_and_are_fitted_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from calib import fit
    from calib.targets import Target

    monkeypatch.setattr(fit, "PointRunner", FormulaRunner)
    base = load_testbed("sangam-h100")
    truth = TimeScales(prefill=0.8, decode=1.3)
    targets = []
    for trace, qps in (("sharegpt", 1.0), ("arxiv", 1.0), ("sharegpt", 2.0), ("arxiv", 2.0)):
        key = PointKey("1C", "deficit", "llada-8b", trace, 1024, qps)
        summary = FormulaRunner(base).run(key, base.progress_spec("llada-8b", trace), truth).summary
        for name, value in summary.items():
            targets.append(Target(key, name, value, 1.0))
    kinds = (IterationKind.PREFILL, IterationKind.DECODE)
    (found,) = fit.fit_targets(base, targets, "none", 10, 0, kinds)  # one model: one fit
    assert [(p.model, p.trace) for p in found.pairs] == [("llada-8b", "sharegpt"), ("llada-8b", "arxiv")]
    assert found.scales.prefill == pytest.approx(0.8, rel=0.01)
    assert found.scales.decode == pytest.approx(1.3, rel=0.01)
    assert found.scales.mixed == 1.0 and len(found.points) == len(targets)
    file = tmp_path / "targets.csv"
    file.write_text("stands in for the targets file\n")
    testbed = fit.fitted_testbed(base, "both", [found], file, "none", 10, 0)
    assert testbed.scales("llada-8b") == found.scales and testbed.progress == base.progress
    assert set(testbed.time_scales["llada-8b"]) == set(kinds)
    assert testbed.fit is not None and set(testbed.fit["pairs"]) == {"llada-8b/sharegpt", "llada-8b/arxiv"}
    assert all(len(testbed.fit["pairs"][pair]["points"]) == 4 for pair in testbed.fit["pairs"])
    apart = fit.fit_targets(base, targets, "mean", 10, 0)  # no scales: each (model, trace) alone
    assert [len(f.pairs) for f in apart] == [1, 1] and all(f.scales == TimeScales() for f in apart)


def test_spread_and_dispersion_are_inverses() -> None:
    for mean, std in ((10.0, 5.0), (3.0, 2.0), (25.0, 4.0)):
        assert spread(mean, dispersion(mean, std)) == pytest.approx(std)


def test_bad_targets_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "layout,policy,model,trace,budget,qps,metric,value\n1C,deficit,llada-8b,sharegpt,1024,1,x,1\n"
    )
    assert main(["fit", "--targets", str(path)]) == 2
    assert "missing column(s) weight" in capsys.readouterr().err
    path.write_text(
        "layout,policy,model,trace,budget,qps,metric,value,weight\n1C,deficit,llada-8b,chat,1024,1,x,1,1\n"
    )
    assert main(["fit", "--targets", str(path)]) == 2
    assert "t.csv, line 2: trace must be one of" in capsys.readouterr().err
    assert main(["fit"]) == 2
    assert "either --targets CSV or --blocks DIR" in capsys.readouterr().err


def test_fit_blocks_measures_forwards_from_a_live_threshold_run(tmp_path: Path) -> None:
    trace, run, out = tmp_path / "tiny.csv", tmp_path / "live", tmp_path / "measured.json"
    trace.write_text("prompt_len,output_len\n16,40\n24,20\n")
    live = [
        sys.executable,
        "-m",
        "cli.main",
        "live",
        "--workers",
        "1",
        "--mode",
        "1C",
        "--unmask",
        "threshold",
    ]
    live += ["--trace", str(trace), "--mask-len", "64", "--qps", "5", "--out", str(run)]
    subprocess.run(live, check=True, capture_output=True, timeout=120)
    with (run / "blocks.csv").open() as f:
        forwards = [int(row["forwards"]) for row in csv.DictReader(f)]
    assert main(["fit", "--blocks", str(run), "--out", str(out)]) == 0
    testbed = load_testbed(str(out))
    model = parse_progress(testbed.progress_spec("llada-8b", "sharegpt"))
    assert model.mean == pytest.approx(sum(forwards) / len(forwards)) and len(forwards) == 3
    assert "tiny-llada, random weights, threshold 0.9" in testbed.progress[("llada-8b", "sharegpt")].source
    summary = json.loads((run / "summary.json").read_text())
    summary["config"]["unmask"] = "schedule"
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["fit", "--blocks", str(run), "--out", str(out)]) == 2


def test_paper_h100_is_reference_h100_fitted_to_the_shipped_figure_8_targets() -> None:
    import hashlib

    from calib.targets import read_targets

    paper, base = load_testbed("paper-h100"), load_testbed("reference-h100")
    targets = Path(__file__).parent.parent / "calib" / "data" / "figure8-targets.csv"
    assert paper.fit is not None and paper.fit["base"] == "reference-h100 v1"
    assert paper.fit["targets_sha256"] == hashlib.sha256(targets.read_bytes()).hexdigest()
    assert all(t.quote.startswith("Section 6.2:") for t in read_targets(targets))
    for pair in (("llada-8b", "sharegpt"), ("llada-8b", "arxiv")):
        record = paper.fit["pairs"]["/".join(pair)]
        assert paper.progress[pair].spec == f"betabinom:{record['mean']:.4g}:{record['std']:.4g}"
        assert "fitted by sangam fit" in paper.progress[pair].source
    assert paper.progress[("dream-7b", "arxiv")] == base.progress[("dream-7b", "arxiv")]
    assert (paper.gpu, paper.profile_data, paper.kv_pages, paper.arrival) == (
        base.gpu, base.profile_data, base.kv_pages, base.arrival,
    )  # fmt: skip
