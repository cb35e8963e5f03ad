"""`sangam reproduce`: the claims file, how a claim is judged, and a run of one figure end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from calib.claims import Claim, judge, parse_point, read_claims
from calib.reproduce import FIGURES, tasks
from cli.main import main


def test_every_claim_reads_quotes_its_sentence_and_belongs_to_a_figure() -> None:
    claims = read_claims()
    assert len(claims) > 60 and len({c.id for c in claims}) == len(claims)
    assert all(c.quote and c.figure in FIGURES for c in claims)
    assert {c.section for c in claims} == {"3.3", "6.2", "6.3", "6.4", "6.5"}
    work = tasks("sangam-h100", FIGURES, [p for c in claims for p in c.points], 10, 0)
    assert len({t.key for t in work}) == len(work)  # every point once
    assert {p for c in claims for p in c.points} <= {t.key for t in work}


def test_a_claim_is_judged_against_its_points() -> None:
    a, b = (
        parse_point("8C/deficit/llada-8b/sharegpt/1024/7.5"),
        parse_point("5P3D/deficit/llada-8b/sharegpt/1024/7.5"),
    )
    summaries = {a: {"mean_e2el_ms": 6000.0, "p99_e2el_ms": 9000.0}, b: {"mean_e2el_ms": 12000.0}}
    value = judge(Claim("9-x", "6.3", "value", a, None, "mean_e2el_s", 7.5, "q"), summaries)
    assert (value.simulated, value.ratio, value.holds) == (6.0, pytest.approx(0.8), None)
    ratio = judge(Claim("9-x", "6.3", "ratio", a, b, "mean_e2el_s", 0.4, "q"), summaries)
    assert (ratio.simulated, ratio.ratio) == (0.5, pytest.approx(1.25))
    assert judge(Claim("9-x", "6.3", "less", a, b, "mean_e2el_s", None, "q"), summaries).holds is True
    assert judge(Claim("9-x", "6.3", "less", b, a, "mean_e2el_s", None, "q"), summaries).holds is False
    mixed = judge(Claim("9-x", "6.3", "less", a, b, "p99_e2el_s|mean_e2el_s", None, "q"), summaries)
    assert (mixed.simulated, mixed.versus, mixed.holds) == (9.0, 12.0, True)
    assert judge(Claim("9-x", "6.3", "below", a, None, "mean_e2el_s", 5.0, "q"), summaries).holds is False


def test_reproduce_one_figure_writes_its_plot_and_claims_as_sangam_sim_gives_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rep"
    assert main(["reproduce", "--figures", "8", "-n", "30", "--jobs", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "8-fastdllm-0.5" in printed and "orderings that hold" in printed
    assert (out / "fig8.png").stat().st_size > 10_000 and not (out / "fig9.png").exists()
    assert (out / "fig8.pdf").read_bytes().startswith(
        b"%PDF"
    ) and "wrote fig8 (.png and .pdf), claims.csv" in printed
    with (out / "claims.csv").open() as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert set(rows) == {c.id for c in read_claims() if c.figure == "fig8"}
    sim = tmp_path / "sim"
    args = ["sim", "--mode", "1C", "--policy", "fastdllm", "--qps", "0.5", "-n", "30", "--out", str(sim)]
    assert main(args) == 0
    mean = json.loads((sim / "summary.json").read_text())["mean_e2el_ms"] / 1000
    assert float(rows["8-fastdllm-0.5"]["simulated"]) == pytest.approx(mean, rel=1e-3)
    assert float(rows["8-fastdllm-0.5"]["ratio"]) == pytest.approx(mean / 20.7, abs=0.006)
    again = tmp_path / "again"
    assert main(["reproduce", "--figures", "fig8", "-n", "30", "--jobs", "1", "--out", str(again)]) == 0
    assert (again / "claims.csv").read_text() == (out / "claims.csv").read_text()  # whatever the processes


def test_an_unknown_figure_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--figures", "7"]) == 2
    assert "no figure '7' (known: fig5, fig8" in capsys.readouterr().err
    assert main(["reproduce", "--figures", "FIG7"]) == 2  # was named 'figFIG7'
    assert "no figure 'FIG7' (known: fig5, fig8" in capsys.readouterr().err
    from calib.reproduce import figure_list

    assert figure_list("FIG8,9") == ["fig8", "fig9"]


def test_the_readmes_fidelity_table_is_the_shipped_claims() -> None:
    root = Path(__file__).parent.parent
    readme = (root / "docs" / "calibration.md").read_text()
    for testbed, column in (("paper-h100", 4), ("sangam-h100", 5)):
        with (root / "benchmarks" / "results" / f"reproduce-{testbed}" / "claims.csv").open() as f:
            shipped = {r["id"]: r for r in csv.DictReader(f)}
        assert set(shipped) == {c.id for c in read_claims()}
        for claim, row in shipped.items():
            line = next(x for x in readme.splitlines() if x.startswith(f"| {claim} |"))
            cell = line.split(" | ")[column]
            assert cell.startswith(row["simulated"]), (testbed, claim, cell)
            if row["holds"]:
                assert f"**{row['holds']}**" in cell, (testbed, claim, cell)
            elif row["ratio"]:
                assert f"({row['ratio']})" in cell, (testbed, claim, cell)
