"""`sangam sim` and `sangam trace` end to end, including bad input (also to `live` and `profile`)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_sim import check_algorithm1

from sangam.cli import main
from sangam.hardware import lookup_model
from sangam.results import ITERATION_COLUMNS
from sim.links import LINKS_DIR


def test_sim_prints_a_table_and_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, log = tmp_path / "run", tmp_path / "iters.csv"
    args = ["sim", "--mode", "3P5C", "--qps", "7.5", "--num-requests", "150", "--out", str(out)]
    assert main([*args, "--iteration-log", str(log)]) == 0
    printed = capsys.readouterr().out
    assert "3P5C" in printed and "p99 e2e s" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 150 and summary["config"]["layout"] == "3P5C"
    assert summary["mean_e2el_ms"] > 0
    with log.open() as f:
        reader = csv.reader(f)
        assert tuple(next(reader)) == ITERATION_COLUMNS
        rows = [dict(zip(ITERATION_COLUMNS, map(float, row), strict=True)) for row in reader]
    assert len(rows) == summary["sim_iterations"]
    by_worker: dict[int, list[dict[str, float]]] = {}
    for row in rows:
        by_worker.setdefault(int(row["worker"]), []).append(row)
    assert sorted(by_worker) == list(range(8))
    for worker, worker_rows in by_worker.items():  # 3 prefill workers (tau 2048), 5 colocated (1024)
        check_algorithm1(worker_rows, 2048 if worker < 3 else 1024)


def test_sim_sweeps_several_rates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--mode", "2C", "--qps", "1,2", "3", "--num-requests", "40", "--out", str(tmp_path)]
    assert main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qps-1", "qps-2", "qps-3"]
    assert capsys.readouterr().out.count("\n") > 5


def test_sim_replays_a_trace_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,100,64\n0.5,200,32\n")
    out = tmp_path / "out"
    assert main(["sim", "--mode", "1P1D", "--trace", str(trace), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 2
    assert summary["config"]["num_requests"] == 2  # what the trace holds, not the default 4000
    assert "  2 requests  " in capsys.readouterr().out


def test_several_rates_over_a_timed_trace_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timed, untimed = tmp_path / "timed.csv", tmp_path / "untimed.csv"
    timed.write_text("arrival_time,prompt_len,output_len\n0.0,100,64\n0.5,200,32\n")
    untimed.write_text("prompt_len,output_len\n100,64\n200,32\n")
    assert main(["sim", "--trace", str(timed), "--qps", "1", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every row has an arrival_time" in err
    assert main(["sim", "--trace", str(untimed), "--qps", "1", "2", "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["qps-1", "qps-2"]


def test_sim_charges_transfers_with_a_measured_link_profile(tmp_path: Path) -> None:
    profile = json.loads((LINKS_DIR / "h200-gloo-shared.json").read_text())
    out = tmp_path / "out"
    args = ["sim", "--mode", "1P1D", "--model", "dream-7b", "--gpu", "h200", "--num-requests", "30"]
    assert main([*args, "--qps", "1", "--link", "h200-gloo-shared", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    measured = {"gb_per_s": profile["gb_per_s"], "latency_s": profile["latency_s"]}
    assert summary["kv_link"] == {"source": "h200-gloo-shared", **measured}
    per_token = lookup_model("dream-7b").kv_bytes_per_token
    with (out / "requests.csv").open() as f:
        seq_len = {row["request_id"]: int(row["seq_len"]) for row in csv.DictReader(f)}
    with (out / "blocks.csv").open() as f:
        blocks = list(csv.DictReader(f))
    moved = [b for b in blocks if int(b["forwards"]) > 1]  # a one-forward block ends with its prefill
    assert moved and all(b["transfer_start"] for b in moved)
    for b in moved:
        expected = profile["latency_s"] + seq_len[b["request_id"]] * per_token / (profile["gb_per_s"] * 1e9)
        assert float(b["transfer_end"]) - float(b["transfer_start"]) == pytest.approx(expected)


def test_trace_command_writes_the_synthetic_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    assert main(["trace", "--dataset", "arxiv", "-n", "300", "-o", str(path)]) == 0
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["arrival_time", "prompt_len", "output_len"] and len(rows) == 300


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "5X3"], "bad mode"),
        (["--mode", "0P3C"], "bad mode"),
        (["--qps", "0"], "positive"),
        (["--qps", "-2"], "positive"),
        (["--qps", "fast"], "positive"),
        (["--budget", "1.5"], "positive integer"),
        (["--budget", "0"], "positive integer"),
        (["--model", "gpt-9"], "unknown model"),
        (["--gpu", "tpu"], "unknown GPU"),
        (["--policy", "lifo"], "invalid choice"),
        (["--progress", "fixed:99"], "progress"),
        (["--trace", "missing.csv"], "missing.csv"),
        (["--pages", "10"], "KV pages"),
        (["--link", "no-such-link"], "no link profile"),
        (["--link-latency-ms", "-1"], ">= 0"),
        (["--arrival-cv", "1e200"], "arrival CV must be in (0, 100]"),  # the gamma shape 1/CV^2 would be 0
    ],
)
def test_bad_input_is_one_line_on_stderr(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--num-requests", "20", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["live", "--port", "99999"], "--port: expected a port number in 0-65535"),
        (["live", "--port", "-1"], "--port: expected a port number in 0-65535"),
        (["live", "--port", "x"], "--port: expected a port number"),
        (["profile", "--model", "gpt-9"], "unknown model"),  # before it looks for a GPU
        (["profile", "--gpu", "tpu", "--from-log", "x.csv"], "unknown GPU"),
    ],
)
def test_other_commands_bad_options_are_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_malformed_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("prompt_len,output_len\n100,64\nabc,32\n")
    assert main(["sim", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "line 3" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("big.csv", 'prompt_len,output_len\n"' + "1" * 200_000 + '",32\n', "line 2: bad CSV: field larger"),
        ("big.jsonl", '{"prompt_len": ' + "1" * 5000 + ', "output_len": 32}\n', "line 1: bad JSON: Exceeds"),
        ("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n", "line 1: bad JSON: maximum recursion"),
    ],
)
def test_traces_the_parsers_choke_on_are_one_line(
    tmp_path: Path, name: str, text: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(text)
    assert main(["sim", "--trace", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_prompt_too_long_for_the_kv_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "long.csv"
    trace.write_text("prompt_len,output_len\n100,64\n3000,64\n")
    assert main(["sim", "--trace", str(trace), "--pages", "100"]) == 2
    assert "request 1" in capsys.readouterr().err


def test_the_installed_command_reports_bad_input_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sangam.cli", "sim", "--mode", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("sangam: error: bad mode") and "Traceback" not in done.stderr
