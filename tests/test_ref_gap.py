"""benchmarks/ref_gap.py: the reference's end-to-end gap over ours per block and per forward, matched by
request, over all requests and over those alone on both live servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.ref_gap import Served, alone, main


def _reference(path: Path, spans: list[tuple[float, float, int]]) -> None:
    """A replay-client JSON at 8 forwards per block: (server arrival, completion, blocks) per request."""
    rows = [
        {"id": i, "status": "COMPLETED", "server_arrival": a, "server_complete": c, "forwards": 8 * b}
        for i, (a, c, b) in enumerate(spans)
    ] + [{"id": 9, "status": "RPC_ERROR"}]
    path.write_text(json.dumps({"forwards_per_block": 8, "rows": rows}))


def _requests_csv(path: Path, spans: list[tuple[float, float, int]]) -> None:
    lines = ["request_id,arrival,end,e2el,n_blocks"]
    lines += [f"{i},{a},{c},{c - a},{b}" for i, (a, c, b) in enumerate(spans)]
    path.write_text("\n".join(lines) + "\n")


def _blocks_csv(path: Path, spans: list[tuple[float, float, int]]) -> None:
    """A live blocks.csv: each request's blocks evenly over its span."""
    lines = ["request_id,block,forwards,ready,end"]
    for i, (a, c, b) in enumerate(spans):
        step = (c - a) / b
        lines += [f"{i},{k},8,{a + k * step},{a + (k + 1) * step}" for k in range(b)]
    path.write_text("\n".join(lines) + "\n")


def test_alone_means_no_overlap_with_any_other_request() -> None:
    served = {
        0: Served(0, 1, 1),
        1: Served(1, 2, 1),
        2: Served(5, 9, 1),
        3: Served(6, 7, 1),
        4: Served(10, 11, 1),
    }
    assert alone(served) == {0, 1, 4}  # touching ends do not overlap; 2 covers 3


def test_gap_per_block_and_forward_all_and_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # request 0 alone everywhere, 1 and 2 overlap on the reference's server
    ref = [(0.0, 1.0, 2), (10.0, 11.5, 3), (11.0, 12.0, 1)]
    ours = [(0.0, 0.6, 2), (10.0, 10.9, 3), (11.0, 11.3, 1)]
    sim = [(0.0, 0.8, 2), (10.0, 11.0, 3), (11.0, 11.4, 1)]
    _reference(tmp_path / "ref.json", ref)
    _blocks_csv(tmp_path / "blocks.csv", ours)
    _requests_csv(tmp_path / "sim.csv", sim)
    argv = ["--reference", str(tmp_path / "ref.json"), "--ours", str(tmp_path / "blocks.csv")]
    assert main([*argv, "--reference-sim", str(tmp_path / "sim.csv")]) == 0
    printed = capsys.readouterr().out.splitlines()
    # all: (0.4 + 0.6 + 0.7) s over 6 blocks; alone: request 0, 0.4 s over 2 blocks
    assert "| all | reference - ours | 3 | 6 | 283.3 | 35.42 |" in printed
    assert "| all | reference - reference-sim | 3 | 6 | 216.7 | 27.08 |" in printed
    assert "| alone | reference - ours | 1 | 2 | 200.0 | 25.00 |" in printed
    assert "| alone | reference - reference-sim | 1 | 2 | 100.0 | 12.50 |" in printed
    assert not any("ours-sim" in line for line in printed)


def test_gap_refuses_another_traces_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _reference(tmp_path / "ref.json", [(0.0, 1.0, 2)])
    _requests_csv(tmp_path / "ours.csv", [(0.0, 1.0, 3)])
    assert main(["--reference", str(tmp_path / "ref.json"), "--ours", str(tmp_path / "ours.csv")]) == 2
    assert capsys.readouterr().err.startswith("error: ours: a request's blocks differ")
