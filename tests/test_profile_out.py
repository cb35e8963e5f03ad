"""Where `sangam profile` writes: `results/profiles` under the working directory by default, and with
`--from-log` into a copy of the shipped profile there, never into the installed package."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cli.main import main
from profiles.store import DATA, read_samples

SHIPPED = DATA / "h200" / "dream-7b.csv"  # a small shipped profile: its refit is quick


def shipped_hashes() -> dict[Path, str]:
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in DATA.rglob("*") if path.is_file()}


def bare_log(folder: Path, start: int = 1) -> Path:
    """A live iteration log of two iterations without its run's summary.json (the bf16 profile takes it)."""
    folder.mkdir()
    log = folder / "iterations.csv"
    log.write_text(
        "worker,start,end,gpu_s,items,cycle_s\n"
        f"0,{start}.0,{start}.25,0.2,d:32:1819;d:32:900,0.5\n"
        f"0,{start}.5,{start}.75,0.2,p:100:100,0.0\n"
    )
    return log


def test_the_default_out_is_results_profiles_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    log = bare_log(tmp_path / "run")
    assert main(["profile", "--model", "dream-7b", "--gpu", "h200", "--from-log", str(log)]) == 0
    root = Path("results/profiles")
    assert (tmp_path / root / "h200" / "dream-7b.csv").is_file()
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"merged 2 iterations into {root / 'h200' / 'dream-7b.csv'}"
    assert out[-1] == (
        f"use it: sangam fit --profile {root / 'h200'} --testbed sangam-h200 --name NAME --out DIR, "
        f"then --testbed DIR/NAME.json"
    )


def test_from_log_merges_into_a_copy_of_the_shipped_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh --out root starts from the shipped data and metadata, and takes the log's iterations there
    (and a later log's on top); a refused log leaves no copy behind; the shipped files stay as they were."""
    before = shipped_hashes()
    root = tmp_path / "profiles"
    args = ["profile", "--model", "dream-7b", "--gpu", "h200", "--out", str(root), "--from-log"]
    other = bare_log(tmp_path / "other")
    (other.parent / "summary.json").write_text(json.dumps({"config": {"model": "llada-8b"}}))
    assert main([*args, str(other)]) == 2
    assert "its run was model 'llada-8b', not 'dream-7b'" in capsys.readouterr().err
    assert not [path for path in root.rglob("*") if path.is_file()]
    assert main([*args, str(bare_log(tmp_path / "run"))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"started from the shipped profile's data in {DATA / 'h200'}"
    shipped = read_samples(SHIPPED)
    merged = read_samples(root / "h200" / "dream-7b.csv")
    assert merged[: len(shipped)] == shipped and len(merged) == len(shipped) + 2
    meta = json.loads((root / "h200" / "dream-7b.meta.json").read_text())
    assert [entry["log"] for entry in meta.pop("merged_logs")] == ["run/iterations.csv"]
    assert meta == json.loads(SHIPPED.with_suffix(".meta.json").read_text())
    assert main([*args, str(bare_log(tmp_path / "later", start=2))]) == 0
    assert capsys.readouterr().out.startswith("merged 2 iterations")
    assert len(read_samples(root / "h200" / "dream-7b.csv")) == len(shipped) + 4
    assert shipped_hashes() == before


def test_from_log_without_a_shipped_profile_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "profiles"
    log = bare_log(tmp_path / "run")
    assert (
        main(["profile", "--model", "dream-7b", "--gpu", "h100", "--out", str(root), "--from-log", str(log)])
        == 2
    )
    err = capsys.readouterr().err
    assert f"no profile of dream-7b in {root / 'h100'} to refit: run sangam profile first" in err
    assert err.count("\n") == 1 and not root.exists()


def test_a_refused_log_leaves_no_folder_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log that is not there: the shipped profile's copy and the folders made for it go again."""
    root = tmp_path / "out" / "profiles"
    assert main(["profile", "--out", str(root), "--from-log", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: No such file or directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_log_of_no_iterations_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A header alone once copied the shipped profile and refitted it, unchanged, for a minute."""
    log = tmp_path / "run" / "iterations.csv"
    log.parent.mkdir()
    log.write_text("worker,start,end,gpu_s,items,cycle_s\n")
    root = tmp_path / "out"
    assert (
        main(["profile", "--model", "dream-7b", "--gpu", "h200", "--out", str(root), "--from-log", str(log)])
        == 2
    )
    assert "iterations.csv: no iterations to merge" in capsys.readouterr().err
    assert not root.exists()
