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
from factories import rounded

from calib.fit import dispersion, spread
from calib.points import PointKey, PointRunner, metric
from cli.main import main
from profiles.store import DATA
from profiles.testbeds import TESTBEDS, load_testbed
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
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    targets, out = tmp_path / "targets.csv", tmp_path / "sangam-h100-fit.json"
    write_targets(targets)
    args = ["fit", "--targets", str(targets), "-n", str(REQUESTS), "--seed", str(SEED)]
    assert main([*args, "--out", str(tmp_path / "fitted.json"), "--name", "other"]) == 2
    shipped = shipped_files()
    monkeypatch.chdir(tmp_path)  # no --out: the working directory, the file named after the testbed
    assert main(args) == 0
    assert shipped_files() == shipped
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


def shipped_files() -> dict[str, bytes]:
    """Every file of the installed package's data, by path: what no command may change."""
    return {str(p.relative_to(DATA)): p.read_bytes() for p in sorted(DATA.rglob("*")) if p.is_file()}


def test_fit_never_replaces_a_shipped_testbed_nor_writes_into_the_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    targets = Path(__file__).parent.parent / "calib" / "data" / "figure8-targets.csv"
    args = ["fit", "--targets", str(targets), "--testbed", "reference-h100", "-n", "10"]
    shipped = shipped_files()
    refused = {
        ("--name", "paper-h100"): "paper-h100 is a shipped testbed, which no command replaces",
        ("--out", str(TESTBEDS / "paper-h100.json")): "paper-h100 is a shipped testbed",
        ("--out", str(TESTBEDS / "mine.json")): "inside the installed package",
        ("--out", str(TESTBEDS)): "inside the installed package",
        ("--out", str(TESTBEDS.parent.parent / "calib"), "--name", "mine"): "inside the installed package",
        ("--out", str(tmp_path / "mine.txt")): "a directory or a testbed file ending in .json",
        ("--out", str(tmp_path), "--name", ""): "--name '': a testbed's name is letters",  # was ignored
        ("--out", str(tmp_path), "--name", "."): "--name '.': a testbed's name is letters",  # wrote ..json
    }
    for extra, error in refused.items():
        assert main([*args, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert error in err and err.count("\n") == 1, (extra, err)
    assert shipped_files() == shipped


def test_testbed_takes_a_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--testbed` names a shipped testbed or a JSON file, in every command that takes it."""
    from cli.main import build_parser

    mine = tmp_path / "beds" / "mine-h100.json"
    mine.parent.mkdir()
    mine.write_text((TESTBEDS / "reference-h100.json").read_text().replace('"reference-h100"', '"mine-h100"'))
    out = tmp_path / "sim"
    assert main(["sim", "--mode", "1C", "-n", "5", "--testbed", str(mine), "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["testbed"] == "mine-h100"
    assert main(["sim", "--mode", "1C", "-n", "5", "--testbed", str(tmp_path / "none.json")]) == 2
    assert f"no testbed file {tmp_path / 'none.json'}" in capsys.readouterr().err
    for command in ("sim", "sweep", "search", "validate", "fit", "reproduce"):  # each says so in its help
        parser = build_parser()
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert "or a JSON file" in " ".join(capsys.readouterr().out.split()), command


def test_every_fitted_shipped_testbed_is_its_recorded_fit() -> None:
    """Refit each shipped testbed that `sangam fit` made from its recorded inputs (targets, base testbed
    and version, free parameters, time scales, requests, seed): the same testbed comes out, apart from
    its name, version and description. A changed base, profile or simulator is caught here."""
    from calib.fit import fit_targets, fitted_testbed
    from calib.targets import read_targets
    from profiles.testbed import testbed_dict
    from profiles.testbeds import known_testbeds

    fitted = [t for t in map(load_testbed, known_testbeds()) if t.fit is not None]
    assert fitted, "no shipped testbed records a fit"
    for shipped in fitted:
        record = shipped.fit
        assert record is not None and "targets" in record, f"{shipped.name}: only target fits are checked"
        base_name, _, version = str(record["base"]).rpartition(" v")
        base = load_testbed(base_name)
        assert base.version == int(version), (
            f"{shipped.name} was fitted on {record['base']}, now version {base.version}: refit and re-ship it"
        )
        targets = Path(__file__).parent.parent / "calib" / "data" / str(record["targets"])
        scaled = record.get("time_scales", {}).values()
        kinds = [IterationKind(k) for k in dict.fromkeys(k for scales in scaled for k in scales)]
        fits = fit_targets(
            base, read_targets(targets), record["free"], record["num_requests"], record["seed"], kinds
        )
        refit = fitted_testbed(base, shipped.name, fits, targets, record["free"], record["num_requests"],
                               record["seed"])  # fmt: skip
        got, want = (
            {k: v for k, v in testbed_dict(t).items() if k not in ("name", "version", "description")}
            for t in (refit, shipped)
        )
        # 5 digits: the last digits of a simulated mean may differ
        assert rounded(got, 5) == rounded(want, 5), shipped.name


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
    head = "layout,policy,model,trace,budget,qps,metric,value,weight\n1C,deficit,llada-8b,sharegpt,1024,1,"
    for row, message in [  # a weight of inf fitted an objective of nan and wrote the testbed
        ("mean_e2el_s,2,inf", "budget, qps, value and weight must be positive and finite"),
        ("mean_e2el_s,inf,1", "budget, qps, value and weight must be positive and finite"),  # math domain
        ("config,2,1", "metric must be a latency statistic (e.g. p99_e2el_s) or a rate, got 'config'"),
        ("mean_e2el_s,2", "the row has no weight (a short row)"),  # was float()'s NoneType message
    ]:
        path.write_text(head + row + "\n")
        assert main(["fit", "--targets", str(path), "--out", str(tmp_path / "x.json")]) == 2
        assert f"t.csv, line 2: {message}" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    assert main(["fit"]) == 2
    assert "--blocks DIR..., --loop DIR... or --profile DIR" in capsys.readouterr().err


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
    rows = (run / "blocks.csv").read_text().splitlines()
    for bad in ("0", "33", "2.5"):  # a testbed of counts:0=1 was once written, which no run could load
        header = rows[0].split(",")
        cells = rows[1].split(",")
        cells[header.index("forwards")] = bad
        (run / "blocks.csv").write_text("\n".join([rows[0], ",".join(cells), *rows[2:]]) + "\n")
        assert main(["fit", "--blocks", str(run), "--out", str(tmp_path / "bad.json")]) == 2
        assert not (tmp_path / "bad.json").exists()
    (run / "blocks.csv").write_bytes(b"\xff\xfe" + (run / "blocks.csv").read_bytes())
    from calib.fit import read_blocks

    with pytest.raises(ValueError, match=r"blocks\.csv: not UTF-8 text$"):  # was the codec's, no file named
        read_blocks([run])
    summary = json.loads((run / "summary.json").read_text())
    summary["config"]["unmask"] = "schedule"
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["fit", "--blocks", str(run), "--out", str(out)]) == 2


def test_paper_h100_is_reference_h100_fitted_to_the_shipped_figure_8_targets() -> None:
    import hashlib

    from calib.targets import read_targets

    paper, base = load_testbed("paper-h100"), load_testbed("reference-h100")
    targets = Path(__file__).parent.parent / "calib" / "data" / "figure8-targets.csv"
    assert paper.fit is not None and paper.fit["base"] == f"reference-h100 v{base.version}"
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
