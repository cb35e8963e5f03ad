"""The calibration runner on CPU with the tiny model, and refitting from a live log."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch

from calib.profile_runner import FILLER, Profiler, grid
from calib.validate import compare
from profiles.shapes import Shape
from profiles.store import merge_log, paths, read_samples


def test_grid_fits_the_pool() -> None:
    small = grid(capacity=400)
    assert small and all(sum(-(-n // 16) for n in (*s.prefills, *s.decodes)) <= 400 for s in small)
    assert len(grid(capacity=1 << 20)) > len(small) >= 20
    assert any(s.prefills and s.decodes for s in grid(1 << 20))  # mixed shapes


def test_profiler_times_real_engine_steps_and_returns_every_page() -> None:
    torch.set_num_threads(1)
    profiler = Profiler("tiny-llada", "random", 512, graphs=False, device=torch.device("cpu"))
    for shape in (Shape((100,), ()), Shape((), (200, 300, 64)), Shape((128,), (96, 96))):
        assert profiler.time(shape, warmup=1, repeats=2) > 0
        assert profiler.pool.num_used == 0
    assert profiler.kv_pages == 512 and profiler.buckets == ()


def test_every_timed_step_follows_the_filler(monkeypatch) -> None:
    profiler = Profiler("tiny-llada", "random", 64, graphs=False, device=torch.device("cpu"))
    ran: list[Shape] = []
    timed = Shape((), (500,))
    seconds = iter([9.0, 1.0, 3.0, 2.0])  # the warm-up's 9 s is dropped

    def step(shape: Shape) -> float:
        ran.append(shape)
        return next(seconds) if shape == timed else 100.0

    monkeypatch.setattr(profiler, "_step", step)
    assert profiler.time(timed, warmup=1, repeats=3) == 2.0
    assert ran == [*FILLER, timed] * 4
    assert any(s.prefills for s in FILLER) and any(s.decodes for s in FILLER)


def test_live_logs_merge_into_the_profile(tmp_path: Path) -> None:
    data, meta, _ = paths("llada-8b", "h200", tmp_path)
    data.parent.mkdir(parents=True)
    data.write_text("items,seconds\np:100:100,0.01")  # hand-edited: no line end after the last row
    meta.write_text(json.dumps({"graph_buckets": [1, 2, 4]}))
    log, other = tmp_path / "qps1" / "iterations.csv", tmp_path / "qps2" / "iterations.csv"
    for path, start in ((log, 1.0), (other, 2.0)):
        path.parent.mkdir()
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["worker", "start", "end", "gpu_s", "items", "cycle_s"])
            writer.writerow([0, start, start + 0.25, 0.2, "d:32:1819;d:32:900", 0.5])  # went straight on
            writer.writerow([0, start + 0.5, start + 0.75, 0.2, "p:100:100", 0.0])  # then waited for work
    assert merge_log("llada-8b", "h200", [log], tmp_path) == 2
    assert read_samples(data) == [
        (Shape((100,), ()), 0.01), (Shape((), (1819, 900)), 0.5), (Shape((100,), ()), 0.25)
    ]  # fmt: skip
    record = json.loads(meta.read_text())
    digest = hashlib.sha256(log.read_bytes()).hexdigest()
    assert record["merged_logs"] == [{"log": "qps1/iterations.csv", "iterations": 2, "sha256": digest}]
    assert record["graph_buckets"] == [1, 2, 4]
    # a log of the same name from another run is merged; one already merged, or the data itself, is not
    assert merge_log("llada-8b", "h200", [other], tmp_path) == 2
    before = data.read_text()
    for again in ([log], [other], [data]):
        with pytest.raises(ValueError, match="already in the llada-8b profile's data"):
            merge_log("llada-8b", "h200", again, tmp_path)
    # a log of another model's run is refused; a bad row names its line; neither writes anything
    dream = tmp_path / "dream" / "iterations.csv"
    dream.parent.mkdir()
    dream.write_text(log.read_text().replace("1819", "1818"))
    (dream.parent / "summary.json").write_text(json.dumps({"config": {"model": "dream-7b", "gpu": "h200"}}))
    with pytest.raises(ValueError, match="its run was model 'dream-7b', not 'llada-8b'"):
        merge_log("llada-8b", "h200", [dream], tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("worker,start,end,items,cycle_s\n0,1.0,1.5,d:32:100,slow\n")
    with pytest.raises(ValueError, match=r"bad\.csv, line 2"):
        merge_log("llada-8b", "h200", [bad], tmp_path)
    assert data.read_text() == before
    assert len(json.loads(meta.read_text())["merged_logs"]) == 2


def test_compare_gives_signed_percent_errors() -> None:
    live = {"mean_e2el_ms": 1000.0, "p99_e2el_ms": 2000.0, "mean_queue_ms": 0.0}
    sim = {"mean_e2el_ms": 1100.0, "p99_e2el_ms": 1900.0, "mean_queue_ms": 5.0}
    assert compare(live, sim) == {"mean_e2el_ms": 10.0, "p99_e2el_ms": -5.0}
    # a colocated run moves no KV: its zero transfer time is left out, a disaggregated one's compared
    live.update(mean_transfer_ms=0.0)
    assert "mean_transfer_ms" not in compare(live, sim | {"mean_transfer_ms": 3.0})
    live.update(mean_transfer_ms=50.0)
    assert compare(live, sim | {"mean_transfer_ms": 40.0})["mean_transfer_ms"] == -20.0
    # nor is a colocated run's 2 ms decode queue (the pause between a block's prefill and its decodes)
    live.update(mean_decode_queue_ms=2.3)
    assert "mean_decode_queue_ms" not in compare(
        live, sim | {"mean_transfer_ms": 40.0, "mean_decode_queue_ms": 0.0}
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("shape,seconds\np:100:100,0.01\n", "neither a profile"),
        ("items,seconds\np:100:100\n", "line 2"),  # a short row
        ("items,seconds\np:100:100,0\n", "line 2: an iteration must take a positive finite time"),
        ("items,seconds\np:100:100,nan\n", "positive finite time"),
        ("items,seconds\np:100:100,-0.5\n", "positive finite time"),
    ],
)
def test_a_malformed_profile_names_its_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "llada-8b.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle):
        read_samples(path)
