"""`sangam sim` and `sangam trace` end to end, including bad input (also to `live` and `profile`)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_sim import check_algorithm1

from cli.main import main
from runs.results import ITERATION_COLUMNS
from runs.traces import read_trace
from sangam.hardware import lookup_model
from sim.links import LINKS_DIR


def test_sims_printout_fits_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns (the terminal's width set explicitly) no printed line is wider; the configuration
    below the table wraps between its fields, whatever the width."""
    trace = tmp_path / "a-trace-file-with-a-long-name-as-researchers-give-them.csv"
    trace.write_text("prompt_len,output_len\n16,40\n24,20\n")
    args = ["sim", "--mode", "1P1C", "--trace", str(trace), "--qps", "2", "--policy", "fastdllm"]
    for width in (80, 100):
        monkeypatch.setenv("COLUMNS", str(width))
        assert main([*args, "-n", "2"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert max(map(len, lines)) <= width, "\n".join(lines)
        text = " ".join(lines)
        for field in ("1P1C", f"trace {trace.name}", "policy fastdllm", "2 requests", "seed 0", "build"):
            assert field in text, field
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sim", "--mode", "3P5C", "--qps", "7.5", "-n", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and "theta 8192" in " ".join(lines), "\n".join(lines)


def test_sim_prints_a_table_and_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, log = tmp_path / "run", tmp_path / "iters.csv"
    args = ["sim", "--mode", "3P5C", "--qps", "7.5", "--num-requests", "150", "--out", str(out)]
    assert main([*args, "--iteration-log", str(log)]) == 0
    printed = capsys.readouterr().out
    assert "3P5C" in printed and "p99" in printed and "transfer" in printed
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
    assert "2 requests" in re.split(r"  +|\n", capsys.readouterr().out)  # a field of the caption


def test_a_timed_trace_records_its_own_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,100,64\n0.5,200,32\n1.0,100,32\n")
    assert main(["sim", "--trace", str(trace), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["config"]["qps"] == 2.0
    assert [row[0] for row in table_rows(capsys.readouterr().out)] == ["2"]


def table_rows(printed: str) -> list[list[str]]:
    """The cells of each row of the printed results table (11 cells, the first the QPS)."""
    rows = [line.split() for line in printed.splitlines()]
    return [row for row in rows if len(row) == 11 and row[0].replace(".", "").isdigit()]


def test_the_table_fits_80_columns_and_cuts_no_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # a narrower terminal still gets the whole table
    trace = tmp_path / ("a-long-directory-name-" * 8) / "trace.csv"
    trace.parent.mkdir()
    trace.write_text("prompt_len,output_len\n" + "100,64\n" * 20)
    out = tmp_path / "out"
    assert (
        main(["sim", "--mode", "1P1D", "--trace", str(trace), "--qps", "1", "123.25", "--out", str(out)]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in "".join(lines)
    assert f"trace {trace.name}" in re.split(r"  +|\n", "\n".join(lines))  # the file, not its long path
    table = lines
    for q in ("1", "123.25"):
        summary = json.loads((out / f"qps-{q}" / "summary.json").read_text())
        (row,) = [row for row in table_rows("\n".join(table)) if row[0] == q]
        assert f"{summary['p99_e2el_ms'] / 1000:.2f}" in row and f"{summary['request_throughput']:.2f}" in row


def test_options_that_would_be_ignored_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timed = tmp_path / "timed.csv"
    timed.write_text("arrival_time,prompt_len,output_len\n0.0,100,64\n0.5,200,32\n")
    for args, needle in [
        (["--mode", "5P3C", "--gpus", "4"], "--mode 5P3C runs 8 workers, not --gpus 4"),
        (["--qps", "6", "6"], "--qps lists 6 twice"),
        (["--qps", "6,7", "--qps", "7"], "--qps lists 7 twice"),
        (["--trace", str(timed), "--arrival-cv", "2"], "--arrival-cv would be ignored"),
    ]:
        assert main(["sim", "--num-requests", "10", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1


def test_repeated_qps_flags_add_points_and_stale_points_go(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["sim", "--num-requests", "10", "--qps", "1", "--qps", "2", "3", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["qps-1", "qps-2", "qps-3"]
    (out / "notes.txt").write_text("mine")
    assert main(["sim", "--num-requests", "10", "--qps", "4,5", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "qps-4", "qps-5"]
    assert main(["sim", "--num-requests", "10", "--qps", "6", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "blocks.csv",
        "notes.txt",
        "requests.csv",
        "summary.json",
    ]


def test_vllm_bench_names_are_aliases(tmp_path: Path) -> None:
    args = ["sim", "--request-rate", "2", "--num-prompts", "12", "--result-dir", str(tmp_path)]
    assert main(args) == 0
    config = json.loads((tmp_path / "summary.json").read_text())["config"]
    assert config["qps"] == 2 and config["num_requests"] == 12


def test_bare_sangam_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("sim", "live", "trace", "app", "profile", "validate"))


@pytest.mark.parametrize("command", ["sim", "live", "trace", "profile", "validate"])
def test_every_option_has_help_and_shows_its_default(command: str) -> None:
    from cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
    for action in sub._actions:
        if action.dest == "help" or action.help == "==SUPPRESS==":
            continue
        assert action.help, f"{command} {action.option_strings} has no help"
        if action.default not in (None, False, True, ()) and action.type is not None:
            assert "(default: " in action.help, f"{command} {action.option_strings} hides its default"


def test_os_errors_are_one_plain_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("")
    assert main(["trace", "-o", str(tmp_path / "afile" / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert err == f"sangam: error: {tmp_path / 'afile' / 't.csv'}: Not a directory\n"


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
    assert summary["kv_link"] == {"source": "h200-gloo-shared", **measured, "handoff_s": 0.0}
    per_token = lookup_model("dream-7b").kv_bytes_per_token()
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
    assert main(["trace", "--trace", "arxiv", "-n", "300", "-o", str(path)]) == 0
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["arrival_time", "prompt_len", "output_len"] and len(rows) == 300
    jsonl = tmp_path / "trace.jsonl"  # once CSV under a .jsonl name, which sim --trace could not read
    assert main(["trace", "--trace", "arxiv", "-n", "300", "-o", str(jsonl)]) == 0
    assert (
        read_trace(jsonl) == read_trace(path) and json.loads(jsonl.read_text().splitlines()[0])["prompt_len"]
    )


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
        (["--model", "gpt-9"], "invalid choice"),
        (["--gpu", "tpu"], "invalid choice"),
        (["--policy", "lifo"], "invalid choice"),
        (["--progress", "fixed:99"], "progress"),
        (["--trace", "missing.csv"], "missing.csv"),
        (["--pages", "10"], "KV pages"),
        (["--link", "no-such-link"], "no link profile"),
        (["--link-latency-ms", "-1"], ">= 0"),
        (["--arrival-cv", "1e200"], "arrival CV must be in [0.001, 100]"),  # gamma shape 1/CV^2: 0
        (["--arrival-cv", "1e-300"], "arrival CV must be in [0.001, 100]"),  # CV^2 is 0: ZeroDivisionError
        (["--progress", "empirical:"], "empirical progress needs a file: empirical:FILE"),  # '.': a folder
        (["--progress", "betabinom:10:1e308"], "spread 1e+308 out of range"),  # squared: OverflowError
        (["--qps", "1e-320"], "qps must be a finite rate of at least 1e-06"),  # gaps were infinite
        (["--qps", ""], "expected a positive number, got ''"),  # was an IndexError
        (["--qps", "6,,7"], "expected a positive number, got ''"),  # was taken as 6,7
        (["--qps", "1", "1.0000001"], "lists 1 twice (1.0 and 1.0000001 both show as 1)"),  # one qps-1/
        (["--mode", "99999999999P1C"], "100000000000 workers, more than 1024"),  # was a MemoryError
        (["--mode", "100000C"], "100000 workers, more than 1024"),  # ran for good
        (["--gpus", "100000"], "100000 workers, more than 1024"),
        (["-n", "1000001"], "num-requests must be at most 1000000"),
        (["--budget", "10000000000000000000000"], "expected a positive integer up to 2147483647"),
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
        (["profile", "--model", "gpt-9"], "invalid choice"),  # before it looks for a GPU
        (["profile", "--gpu", "tpu", "--from-log", "x.csv"], "invalid choice"),
        (["trace", "--trace", "t.csv", "-o", "x.csv"], "a synthetic trace is one of sharegpt, arxiv"),
        (["trace", "--qps", "1", "2", "-o", "x.csv"], "unrecognized arguments: 2"),
        (["reproduce", "--figures", ""], "an empty figure name in ''"),  # ran no figure and exited 0
        (["reproduce", "--figures", "8,,9"], "an empty figure name in '8,,9'"),
        (
            ["search", "--max-qps", "1e308", "--slo", "p99_e2el_s=20", "--granularity", "0.5"],
            "--max-qps 1e+308 over the granularity 0.5 requests/s: more than 1e+12 steps",
        ),  # was an OverflowError
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
        [sys.executable, "-m", "cli.main", "sim", "--mode", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("sangam: error: bad mode") and "Traceback" not in done.stderr


def test_sim_fails_and_restarts_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "--mode", "4C", "--num-requests", "400", "--qps", "4", "--out", str(tmp_path)]
    assert main([*args, "--fail", "1@10,2@20", "--restart-after", "5"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["workers_lost"] == 2 and summary["completed"] == 400 and summary["failed"] == 0
    assert summary["requests_recovered"] > 0 and summary["forwards_redone"] > 0
    for bad, needle in [
        (["--fail", "9@10"], "cannot fail worker 9"),
        (["--fail", "1@"], "bad failure '1@'"),
        (["--restart-after", "3"], "--restart-after needs --fail"),
    ]:
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1


def test_a_run_in_which_no_request_completes_prints_dashes_and_search_counts_it_a_miss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every worker lost for good at once: no latency exists, the table says '-' (no traceback), and a
    search finds no rate that meets a latency SLO."""
    args = ["--mode", "2C", "--num-requests", "30", "--fail", "0@1,1@1"]
    assert main(["sim", *args, "--out", str(tmp_path / "sim")]) == 0
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["completed"] == 0 and "mean_e2el_ms" not in summary
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("7.5")]
    assert row == ["7.5", "0", *["-"] * 9]
    search = ["search", "--gpus", "2", "--layouts", "2C", "--slo", "p99_e2el_s=20", *args[2:]]
    assert main([*search, "--out", str(tmp_path / "search.csv")]) == 0
    assert "best: 2C (tau 1024, theta 8192) at 0 QPS" in capsys.readouterr().out
    sweep = ["sweep", "--gpus", "2", "--layouts", "2C", "--qps", "2", "--jobs", "1", *args[2:]]
    assert main([*sweep, "--out", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "latency-llada-8b-sharegpt.png").is_file()


@pytest.mark.parametrize(
    "args",
    [["sim", "--out", ""], ["sim", "--iteration-log", " "], ["sweep", "--out", ""], ["fit", "--loop", ""],
     ["validate", "--report", ""], ["profile", "--from-log", "a.csv", ""]],
)  # fmt: skip
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith(": an empty path\n") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_text_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00bad")
    shutil.copy(binary, tmp_path / "binary.json")
    for args in (
        ["fit", "--targets", str(binary), "--out", str(tmp_path / "fitted.json")],
        ["sim", "--testbed", str(tmp_path / "binary.json"), "-n", "5"],
        ["profile", "--from-log", str(binary), "--out", str(tmp_path / "profiles")],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "binary." in err and ("not UTF-8 text" in err or "can't decode" in err), err
        assert err.count("\n") == 1


def test_profile_measures_unless_logs_are_given() -> None:
    from cli.main import build_parser
    from cli.profile import ProfileOptions
    from runs.options import collect

    parser = build_parser()
    assert collect(ProfileOptions, parser.parse_args(["profile"])).from_log == ()
    given = parser.parse_args(["profile", "--from-log", "a.csv", "b.csv"])
    assert collect(ProfileOptions, given).from_log == (Path("a.csv"), Path("b.csv"))


def test_a_rate_for_a_timed_trace_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace whose rows all have an arrival_time is replayed at its own rate (here 2 requests/s):
    --qps 5 would be ignored, so sim and sweep refuse it in one line naming that rate."""
    timed = tmp_path / "timed.csv"
    timed.write_text("arrival_time,prompt_len,output_len\n0.0,100,64\n0.5,200,32\n1.0,100,32\n")
    for command in (["sim"], ["sweep", "--out", str(tmp_path / "sweep")]):
        assert main([*command, "--trace", str(timed), "--qps", "5", "-n", "10"]) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1 and f"--qps 5: {timed}: every row has an arrival_time (2 requests/s)" in err
        )
    assert main(["sim", "--trace", str(timed), "--out", str(tmp_path / "out")]) == 0  # no --qps: replayed


def test_trace_help_says_qps_takes_one_rate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    printed = " ".join(capsys.readouterr().out.split())
    assert "--qps QPS, --request-rate QPS arrival rate, requests/s: one value, one trace" in printed
    assert "several" not in printed
    assert main(["trace", "--qps", "6,7", "-o", "x.csv"]) == 2
    assert "6,7: a trace has one rate; run sangam trace once per rate" in capsys.readouterr().err


def test_trace_to_dash_writes_stdout_not_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "-n", "3", "-o", "-"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == "arrival_time,prompt_len,output_len" and len(out.out.splitlines()) == 4
    assert out.err == "wrote 3 requests to stdout\n" and list(tmp_path.iterdir()) == []
    assert main(["trace", "-n", "3", "-o", "t.csv"]) == 0
    assert (tmp_path / "t.csv").read_text() == out.out  # the same bytes as the file


@pytest.mark.parametrize(
    "command",
    [["sim"], ["trace", "-o", "x.csv"], ["sweep", "--out", "x"], ["search", "--slo", "p99_e2el_s=9"]],
)
def test_a_misspelt_trace_suggests_the_close_one(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--trace", "sharegtp", "-n", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace sharegtp: unknown trace; did you mean sharegpt?" in err
