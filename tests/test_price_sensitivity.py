"""`benchmarks.price_sensitivity` over the shipped FP8 live run: unscaled it is `sangam validate`'s report,
and dearer decodes make the simulation slower."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import price_sensitivity

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
RUN = RESULTS / "live-colocated-fp8-llada-8b-h200-11" / "seed14"
REPORT = RESULTS / "validate-llada-8b-h200-colocated-fp8-11-seed14.json"


def args() -> argparse.Namespace:
    return argparse.Namespace(
        live_results=str(RUN), seed=14, qps=1.84, num_requests=150, model="llada-8b", gpu="h200",
        testbed="sangam-h200-fp8",
    )  # fmt: skip


def test_unscaled_prices_give_the_shipped_validation_and_dearer_decodes_a_slower_simulation() -> None:
    shipped = json.loads(REPORT.read_text())[0]["error_pct"]
    same = price_sensitivity.scaled_validate(args(), 1.0, 1.0)
    assert round(same["mean"], 1) == round(shipped["mean_e2el_ms"], 1) == -6.1
    assert round(same["p99"], 1) == round(shipped["p99_e2el_ms"], 1)
    dearer = price_sensitivity.scaled_validate(args(), 1.0, 1.1)
    assert same["mean"] < dearer["mean"]  # decodes of 5+ items 10% dearer: -6.1% becomes -1.6%
    again = price_sensitivity.scaled_validate(args(), 1.0, 1.0)
    assert again == same  # the cost model is put back after each run


@pytest.mark.parametrize("bad", ["abc", "1:2:3", "0:1"])
def test_a_bad_scale_is_a_one_line_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        price_sensitivity.main(["--live-results", str(RUN), "--seed", "14", "--qps", "1.84", "--scale", bad])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"price_sensitivity: error: argument --scale: invalid scale value: '{bad}'"
