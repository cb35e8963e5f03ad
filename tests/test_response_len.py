"""Each request's own mask buffer in the simulator: a trace's max_tokens in whole blocks (`mask_len_of`, the
one rule `sangam sim` and `sangam live` share), the fixed `--mask-len` without it, and a run sized so."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.main import main
from runs.config import RunConfig, build_requests, mask_len_of
from sangam.hardware import BLOCK
from sangam.workload import TraceRow


def test_a_requests_mask_buffer_is_its_max_tokens_in_whole_blocks_else_the_fixed_one() -> None:
    cfg = RunConfig(trace="t.csv", mask_len=256, pages=1000)
    rows = [
        TraceRow(100, 40, 0.0, max_tokens=64),
        TraceRow(100, 40, 0.1, max_tokens=65),
        TraceRow(100, 40, 0.2),
        TraceRow(100, 1, 0.3, max_tokens=1),
        TraceRow(100, 200, 0.4, max_tokens=256),
    ]
    requests = build_requests(cfg, rows)
    assert [r.mask_len for r in requests] == [64, 96, 256, 32, 256]
    assert [r.seq_len for r in requests] == [164, 196, 356, 132, 356]
    assert [r.pages for r in requests] == [11, 13, 23, 9, 23]


def test_max_tokens_beyond_mask_len_is_refused_in_one_line() -> None:
    cfg = RunConfig(trace="t.csv", mask_len=256, pages=1000)
    with pytest.raises(ValueError) as info:
        build_requests(cfg, [TraceRow(10, 10, 0.0), TraceRow(10, 10, 0.5, max_tokens=257)])
    assert str(info.value) == (
        "request 1: max_tokens 257 needs a 288-token mask buffer, beyond --mask-len 256 (raise --mask-len)"
    )


@given(
    output=st.integers(1, 2000),
    extra=st.integers(0, 2000),
    mask_blocks=st.integers(1, 80),
    given_max=st.booleans(),
)
def test_mask_len_of_is_whole_blocks_covering_max_tokens_within_mask_len(
    output: int, extra: int, mask_blocks: int, given_max: bool
) -> None:
    cfg = RunConfig(trace="t.csv", mask_len=BLOCK * mask_blocks)
    row = TraceRow(7, output, 0.0, max_tokens=output + extra if given_max else None)
    fits = (row.max_tokens or output) <= cfg.mask_tokens
    if not fits:
        with pytest.raises(ValueError, match=r"^request 3: .*\(raise --mask-len\)$"):
            mask_len_of(cfg, row, 3)
        return
    mask_len = mask_len_of(cfg, row, 3)
    assert mask_len % BLOCK == 0 and output <= mask_len <= cfg.mask_tokens
    if row.max_tokens is None:
        assert mask_len == cfg.mask_tokens
    else:
        assert row.max_tokens <= mask_len < row.max_tokens + BLOCK


def write(path: Path, rows: list[tuple[int, int, int | None]]) -> Path:
    """A trace of (prompt_len, output_len, max_tokens or None) rows, 0.2 s apart."""
    lines = ["arrival_time,prompt_len,output_len,max_tokens"]
    lines += [f"{0.2 * i},{p},{o},{'' if m is None else m}" for i, (p, o, m) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sim_runs_each_request_over_its_own_sequence_and_does_less_work(tmp_path: Path) -> None:
    mixed = [(300, 50, 64), (500, 200, 256), (400, 900, 1024), (200, 30, None), (300, 60, 64)] * 4
    sized = write(tmp_path / "sized.csv", mixed)
    fixed = write(tmp_path / "fixed.csv", [(p, o, None) for p, o, _ in mixed])
    for trace in (sized, fixed):
        argv = [
            "sim",
            "--trace",
            str(trace),
            "--gpus",
            "2",
            "--mask-len",
            "1024",
            "--out",
            str(tmp_path / trace.stem),
        ]
        assert main(argv) == 0
    with (tmp_path / "sized" / "requests.csv").open() as f:
        requests = sorted(csv.DictReader(f), key=lambda r: int(r["request_id"]))
    own = [1024 if m is None else -(-m // BLOCK) * BLOCK for _, _, m in mixed]
    assert [int(r["seq_len"]) for r in requests] == [p + m for (p, _, _), m in zip(mixed, own, strict=True)]
    assert [int(r["n_blocks"]) for r in requests] == [-(-o // BLOCK) for _, o, _ in mixed]
    summaries = {
        name: json.loads((tmp_path / name / "summary.json").read_text()) for name in ("sized", "fixed")
    }
    assert summaries["sized"]["completed"] == summaries["fixed"]["completed"] == len(mixed)
    assert summaries["sized"]["mean_e2el_ms"] < summaries["fixed"]["mean_e2el_ms"]
    assert summaries["sized"]["config"]["mask_len"] == 1024  # the largest allowed, as given


def test_sim_refuses_a_trace_whose_max_tokens_passes_mask_len(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "t.csv", [(100, 64, 64), (100, 64, 600)])
    assert main(["sim", "--trace", str(trace), "--mask-len", "512"]) == 2
    err = capsys.readouterr().err
    assert "request 1: max_tokens 600 needs a 608-token mask buffer, beyond --mask-len 512" in err
    assert err.count("\n") == 1 and "Traceback" not in err
