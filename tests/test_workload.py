"""Synthetic workloads (Table 1 statistics, arrival processes) and trace files (round trip, bad input)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.config import RunConfig, synthetic_rows
from runs.traces import TraceError, read_steps, read_trace, write_trace
from sangam.workload import (
    MASK_LEN,
    MAX_TOKENS,
    TraceRow,
    gamma_arrivals,
    poisson_arrivals,
    sample_lengths,
    with_arrivals,
)

# Paper Table 1, after the prompt + output <= 4096 filter: (median, p99, std) of prompt and of output.
TABLE_1 = {
    "sharegpt": ((795, 2007, 596), (266, 874, 206)),
    "arxiv": ((2827, 3923, 890), (162, 360, 73)),
}


def stats(values: np.ndarray) -> tuple[float, float, float]:
    """Median, p99 (numpy's default linear percentile) and population standard deviation."""
    return float(np.percentile(values, 50)), float(np.percentile(values, 99)), float(np.std(values))


# --- lengths -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["sharegpt", "arxiv"])
def test_lengths_match_table_1(dataset: str) -> None:
    pairs = np.array(sample_lengths(dataset, 20_000, random.Random(0)))
    for column, targets in zip(pairs.T, TABLE_1[dataset], strict=True):
        for got, want in zip(stats(column), targets, strict=True):
            assert got == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("dataset", ["sharegpt", "arxiv"])
def test_lengths_are_positive_integers_under_the_filter(dataset: str) -> None:
    pairs = sample_lengths(dataset, 5000, random.Random(1))
    assert len(pairs) == 5000
    for prompt, output in pairs:
        assert type(prompt) is int and type(output) is int
        assert prompt >= 1 and output >= 1 and prompt + output <= MAX_TOKENS
        assert output <= MASK_LEN[dataset]  # seed 1 draws 5 sharegpt outputs over 1024 before that filter


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.sampled_from(sorted(MASK_LEN)))
def test_no_output_outgrows_the_mask_buffer(seed: int, dataset: str) -> None:
    """The mask buffer is sized for the longest output: a longer one is redrawn, never returned. (About
    1 sharegpt output in 500 is longer before the filter, so 2000 draws nearly always meet one.)"""
    pairs = sample_lengths(dataset, 2000, random.Random(seed))
    assert max(output for _, output in pairs) <= MASK_LEN[dataset]


def test_same_seed_same_workload() -> None:
    assert sample_lengths("arxiv", 500, random.Random(7)) == sample_lengths("arxiv", 500, random.Random(7))
    assert sample_lengths("arxiv", 500, random.Random(7)) != sample_lengths("arxiv", 500, random.Random(8))
    cfg = RunConfig(num_requests=300, qps=4.0, arrival_cv=2.0, seed=3)
    assert synthetic_rows(cfg) == synthetic_rows(cfg)


def test_lengths_do_not_change_with_the_rate() -> None:
    slow, fast = (synthetic_rows(RunConfig(num_requests=100, qps=q)) for q in (1.0, 9.0))
    assert [(r.prompt_len, r.output_len) for r in slow] == [(r.prompt_len, r.output_len) for r in fast]
    assert fast[-1].arrival_time == pytest.approx(slow[-1].arrival_time / 9.0)


def test_unknown_dataset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown dataset 'lmsys' \(known: sharegpt, arxiv\)"):
        sample_lengths("lmsys", 10, random.Random(0))
    assert set(MASK_LEN) == set(TABLE_1)


# --- arrivals ----------------------------------------------------------------------------------


def test_poisson_arrivals_have_the_requested_rate() -> None:
    times = poisson_arrivals(20_000, 5.0, random.Random(0))
    gaps = np.diff([0.0, *times])
    assert times[0] > 0 and np.all(gaps >= 0)
    assert len(times) / times[-1] == pytest.approx(5.0, rel=0.03)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.03)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_arrivals_have_the_requested_rate_and_cv(cv: float) -> None:
    times = gamma_arrivals(20_000, 3.0, cv, random.Random(0))
    gaps = np.diff([0.0, *times])
    assert np.all(gaps >= 0)
    assert len(times) / times[-1] == pytest.approx(3.0, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(cv, rel=0.05)


@pytest.mark.parametrize(("qps", "cv", "needle"), [(0.0, None, "qps"), (-1.0, 2.0, "qps"), (1.0, 0.0, "CV")])
def test_bad_rates_are_rejected(qps: float, cv: float | None, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        with_arrivals([TraceRow(10, 10)], qps, random.Random(0), cv)


def test_with_arrivals_fills_only_missing_times() -> None:
    bare = [TraceRow(10, 40), TraceRow(20, 50)]
    filled = with_arrivals(bare, 2.0, random.Random(9))
    assert [r.arrival_time for r in filled] == poisson_arrivals(2, 2.0, random.Random(9))
    timed = [TraceRow(10, 40, 1.5), TraceRow(20, 50, 2.5)]
    assert with_arrivals(timed, 2.0, random.Random(9), cv=3.0) == timed
    mixed = with_arrivals([TraceRow(1, 1, 4.0), TraceRow(1, 1)], 2.0, random.Random(9))
    assert mixed[0].arrival_time == 4.0 and mixed[1].arrival_time is not None and mixed[1].arrival_time > 4.0
    (drawn,) = with_arrivals([TraceRow(1, 20, steps=(3,), max_tokens=40)], 2.0, random.Random(9))
    assert (drawn.steps, drawn.max_tokens) == ((3,), 40)  # a drawn arrival keeps every other field


def test_trace_row_checks_its_steps() -> None:
    assert TraceRow(5, 33, steps=(1, 32)).n_blocks == 2
    with pytest.raises(ValueError, match="2 blocks"):
        TraceRow(5, 33, steps=(4,))
    with pytest.raises(ValueError, match=r"\[1, 32\]"):
        TraceRow(5, 32, steps=(33,))
    with pytest.raises(ValueError, match="prompt_len"):
        TraceRow(0, 32)
    with pytest.raises(ValueError, match="max_tokens 31 is less than output_len 32"):
        TraceRow(5, 32, max_tokens=31)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer, got 0"):
        TraceRow(5, 32, max_tokens=0)


# --- trace files -------------------------------------------------------------------------------


def test_csv_round_trip(tmp_path: Path) -> None:
    rows = synthetic_rows(RunConfig(num_requests=50, seed=2))
    path = tmp_path / "t.csv"
    write_trace(path, rows)
    assert path.read_text().splitlines()[0] == "arrival_time,prompt_len,output_len"
    assert read_trace(path) == rows


def test_csv_round_trip_with_steps_and_no_arrivals(tmp_path: Path) -> None:
    rows = [TraceRow(100, 64, steps=(3, 32)), TraceRow(7, 1), TraceRow(9, 33, steps=(1, 1))]
    path = tmp_path / "t.csv"
    write_trace(path, rows)
    assert path.read_text().splitlines()[:2] == ["arrival_time,prompt_len,output_len,steps", ",100,64,3;32"]
    assert read_trace(path) == rows


def test_max_tokens_column_round_trips_and_may_be_blank(tmp_path: Path) -> None:
    rows = [TraceRow(100, 64, 0.5, max_tokens=100), TraceRow(7, 1, 0.75), TraceRow(9, 33, 1.0, (1, 1), 33)]
    path = tmp_path / "t.csv"
    write_trace(path, rows)
    assert path.read_text().splitlines()[:3] == [
        "arrival_time,prompt_len,output_len,steps,max_tokens", "0.5,100,64,,100", "0.75,7,1,,",
    ]  # fmt: skip
    assert read_trace(path) == rows
    jsonl = tmp_path / "t.jsonl"
    lines = [
        {"prompt_len": 5, "output_len": 6, "max_tokens": 64},
        {"prompt_len": 5, "output_len": 6, "max_tokens": None},
    ]
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_trace(jsonl) == [TraceRow(5, 6, max_tokens=64), TraceRow(5, 6)]


def test_csv_columns_in_any_order_and_steps_with_spaces(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("output_len,steps,prompt_len\n64,4 5,10\n\n32,,11\n")
    assert read_trace(path) == [TraceRow(10, 64, steps=(4, 5)), TraceRow(11, 32)]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    rows = [TraceRow(100, 64, 0.0, (3, 32)), TraceRow(7, 1, 0.25), TraceRow(9, 33, 0.25, (1, 1))]
    path = tmp_path / "t.jsonl"
    lines = []
    for r in rows:
        obj = {"arrival_time": r.arrival_time, "prompt_len": r.prompt_len, "output_len": r.output_len}
        if r.steps is not None:
            obj["steps"] = list(r.steps)
        lines.append(json.dumps(obj))
    path.write_text("\n".join(lines) + "\n")
    assert read_trace(path) == rows
    json_path = tmp_path / "t.json"
    json_path.write_text('{"prompt_len": 5, "output_len": 6, "arrival_time": null}\n')
    assert read_trace(json_path) == [TraceRow(5, 6)]


def test_read_steps(tmp_path: Path) -> None:
    text = tmp_path / "steps.txt"
    text.write_text("3, 4 5\n32;1\n")
    assert read_steps(text) == [3, 4, 5, 32, 1]
    trace = tmp_path / "t.csv"
    write_trace(trace, [TraceRow(1, 64, steps=(2, 9)), TraceRow(1, 5)])
    assert read_steps(trace) == [2, 9]
    text.write_text("3\n0\n")
    with pytest.raises(TraceError, match=r"steps\.txt line 2"):
        read_steps(text)


MALFORMED = [
    ("t.csv", "", 1, "empty"),
    ("t.csv", "arrival_time,prompt_len\n0.0,5\n", 1, "missing required column 'output_len'"),
    ("t.csv", "prompt_len,output_len,colour\n5,6,red\n", 1, "unknown column 'colour'"),
    ("t.csv", "prompt_len,output_len,prompt_len\n5,6,7\n", 1, "appears twice"),
    ("t.csv", "prompt_len,output_len\n", 1, "no requests"),
    ("t.csv", "prompt_len,output_len\n5,6\nabc,7\n", 3, "prompt_len must be a positive integer, got 'abc'"),
    ("t.csv", "prompt_len,output_len\n5,6\n\n5,0\n", 4, "output_len must be a positive integer, got '0'"),
    ("t.csv", "prompt_len,output_len\n5,6.5\n", 2, "output_len must be a positive integer"),
    ("t.csv", "prompt_len,output_len\n5,-6\n", 2, "output_len must be a positive integer"),
    ("t.csv", "prompt_len,output_len\n5,6,7\n", 2, "expected 2 fields, got 3"),
    ("t.csv", "arrival_time,prompt_len,output_len\nsoon,5,6\n", 2, "arrival_time must be a number"),
    ("t.csv", "arrival_time,prompt_len,output_len\nnan,5,6\n", 2, "arrival_time must be a number"),
    ("t.csv", "arrival_time,prompt_len,output_len\n1e300,5,6\n", 2, "arrival_time must be in [0, 1e+09]"),
    ("t.csv", "arrival_time,prompt_len,output_len\n-1,5,6\n", 2, "arrival_time must be in [0, 1e+09]"),
    ("t.csv", "arrival_time,prompt_len,output_len\n1.0,5,6\n2.0,5,6\n1.5,5,6\n", 4, "arrival order"),
    ("t.csv", "arrival_time,prompt_len,output_len\n1.0,5,6\n,5,6\n", 3, "line 2 has one"),
    ("t.csv", "arrival_time,prompt_len,output_len\n,5,6\n1.0,5,6\n", 3, "line 2 has none"),
    ("t.csv", "prompt_len,output_len,steps\n5,64,3\n", 2, "1 values, but output_len 64 makes 2 blocks"),
    ("t.csv", "prompt_len,output_len,steps\n5,64,3;33\n", 2, "in [1, 32], got 33"),
    ("t.csv", "prompt_len,output_len,steps\n5,64,3;x\n", 2, "in [1, 32], got 'x'"),
    (
        "t.csv",
        "prompt_len,output_len,max_tokens\n5,64,64\n5,64,63\n",
        3,
        "max_tokens 63 is less than output_len 64",
    ),
    (
        "t.csv",
        "prompt_len,output_len,max_tokens\n5,64,lots\n",
        2,
        "max_tokens must be a positive integer, got 'lots'",
    ),
    (
        "t.jsonl",
        '{"prompt_len": 5, "output_len": 6, "max_tokens": 6.5}\n',
        1,
        "max_tokens must be a positive integer",
    ),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6}\n{"prompt_len": 5,\n', 2, "bad JSON"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6}\n[5, 6]\n', 2, "expected a JSON object, got list"),
    ("t.jsonl", '{"prompt_len": 5}\n', 1, "missing required key 'output_len'"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6, "id": 1}\n', 1, "unknown key 'id'"),
    (
        "t.jsonl",
        '{"prompt_len": "5", "output_len": 6}\n',
        1,
        "prompt_len must be a positive integer, got '5'",
    ),
    (
        "t.jsonl",
        '{"prompt_len": 5, "output_len": true}\n',
        1,
        "output_len must be a positive integer, got True",
    ),
    ("t.jsonl", '{"prompt_len": 5.0, "output_len": 6}\n', 1, "prompt_len must be a positive integer"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6, "steps": "1"}\n', 1, "steps must be a list"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 40, "steps": [1]}\n', 1, "makes 2 blocks"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6, "arrival_time": "1"}\n', 1, "arrival_time must be"),
    ("t.jsonl", '{"prompt_len": 5, "output_len": 6, "prompt_len": 9}\n', 1, "key 'prompt_len' given twice"),
    (
        "t.jsonl",
        '\n{"prompt_len": 5, "output_len": 6, "arrival_time": 2}\n{"prompt_len": 5, "output_len": 6, '
        '"arrival_time": 1}\n',
        3,
        "arrival order",
    ),
]


@pytest.mark.parametrize(("name", "content", "line", "needle"), MALFORMED)
def test_malformed_trace_names_file_and_line(
    tmp_path: Path, name: str, content: str, line: int, needle: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path} line {line}: ") and needle in message and "\n" not in message


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: no such trace file"):
        read_trace(tmp_path / "nope.csv")
    path = tmp_path / "trace.tsv"
    path.write_text("prompt_len\toutput_len\n5\t6\n")
    with pytest.raises(TraceError, match=r"trace\.tsv: unknown trace format '.tsv'"):
        read_trace(path)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"prompt_len,output_len\n\xff\xfe,1\n")
    with pytest.raises(TraceError, match=r"bin\.csv: not UTF-8"):
        read_trace(binary)
    assert issubclass(TraceError, ValueError)


@st.composite
def traces(draw: st.DrawFn) -> list[TraceRow]:
    n = draw(st.integers(1, 12))
    timed = draw(st.booleans())
    gaps = draw(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=n, max_size=n))
    rows = []
    now = draw(st.floats(0, 1e6, allow_nan=False)) if timed else 0.0
    for i in range(n):
        output = draw(st.integers(1, 200))
        blocks = -(-output // 32)
        steps = draw(st.none() | st.tuples(*[st.integers(1, 32)] * blocks))
        now += gaps[i]
        max_tokens = draw(st.none() | st.integers(output, 10**6))
        rows.append(TraceRow(draw(st.integers(1, 10**6)), output, now if timed else None, steps, max_tokens))
    return rows


@settings(max_examples=60)
@given(traces())
def test_any_valid_trace_survives_a_csv_round_trip(rows: list[TraceRow]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        write_trace(path, rows)
        assert read_trace(path) == rows
