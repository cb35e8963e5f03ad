"""A colocated live run of LLaDA-8B (random weights, forced schedule) on one GPU."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cli.main import main
from runs.results import PARTS

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def test_llada_colocated_on_one_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "live"
    args = ["live", "--mode", "colocated", "--gpus", "1", "--gpu", "h200", "--model", "llada-8b"]
    args += ["--num-requests", "24", "--qps", "2", "--out", str(out)]
    args += ["--iteration-log", str(tmp_path / "it.csv")]
    assert main(args) == 0
    print(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 24
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        assert sum(float(row[p]) for p in PARTS) == pytest.approx(float(row["e2el"]), abs=1e-6)
    with (out / "blocks.csv").open() as f:
        blocks = list(csv.DictReader(f))
    assert len(blocks) == sum(int(r["n_blocks"]) for r in rows)
