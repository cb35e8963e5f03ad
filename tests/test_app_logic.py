"""The explorer's pure parts: input checks, sweeps, derived series, knees, and sim-vs-live replay."""

from __future__ import annotations

import json
import math
import multiprocessing
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from app import analysis
from app.inputs import (
    InputError,
    build_setup,
    default_mask_len,
    parse_layouts,
    parse_seeds,
    qps_points,
    read_uploaded_trace,
)
from app.launch import add_app_arguments, run_app, streamlit_command
from app.live_data import comparison_frame, live_rows, load_directory, load_files, twin_spec
from app.series import Intervals, binned_max, block_intervals, record_table, rows_table, worker_series
from app.sweep import (
    LATENCY_COLUMNS,
    PointResult,
    PointSpec,
    point_rows,
    point_specs,
    profile_label,
    resolve,
    run_point,
    run_sweep,
)
from cli.main import main as cli_main
from profiles.testbeds import load_testbed
from runs.config import RunConfig
from runs.results import METRICS
from sim.options import SimOptions
from sim.run import simulate


def sim_results_dir(tmp_path: Path, mode: str = "3P5C", n: int = 40, extra: Sequence[str] = ()) -> Path:
    """What `sangam sim --out` writes, which is what `sangam live --out` writes."""
    args = ["sim", "--mode", mode, "--qps", "8", "--num-requests", str(n), "--out", str(tmp_path)]
    assert cli_main([*args, *extra]) == 0
    return tmp_path


# --- inputs -----------------------------------------------------------------------------------------


def test_qps_points_are_evenly_spaced_and_bad_ranges_say_why() -> None:
    assert qps_points(4, 13, 10) == tuple(float(q) for q in range(4, 14))
    assert qps_points(5, 5, 3) == (5.0,)
    with pytest.raises(InputError, match="QPS range is empty: min 9 is above max 4"):
        qps_points(9, 4, 3)
    with pytest.raises(InputError, match="at least one point"):
        qps_points(1, 2, 0)
    with pytest.raises(InputError, match="lowest QPS must be positive"):
        qps_points(0, 2, 3)
    assert qps_points(4.0, 4.0001, 3) == (4.0, 4.0001)  # 4.00005 rounds onto 4.0: one point, not two
    with pytest.raises(InputError, match=r"lowest QPS must be at least 0\.0001"):
        qps_points(0.00001, 1, 2)  # rounds to 0


def test_layouts_are_checked_against_the_gpu_count() -> None:
    assert parse_layouts("colocated, 5P3D 3p5c, 8C", 8) == ("8C", "5P3D", "3P5C")
    with pytest.raises(InputError, match="layout 4P2D uses 6 GPUs but the GPU count is 8"):
        parse_layouts("colocated, 4P2D", 8)
    with pytest.raises(InputError, match="bad mode"):
        parse_layouts("5X3", 8)
    with pytest.raises(InputError, match="at least 1"):
        parse_layouts("colocated", 0)
    with pytest.raises(InputError, match="at least one layout"):
        parse_layouts(" , ", 8)


def test_seeds_and_a_whole_setup() -> None:
    assert parse_seeds("0, 1 1,2") == (0, 1, 2)
    with pytest.raises(InputError, match="whole numbers"):
        parse_seeds("0, x")
    setup = build_setup(
        model="dream-7b", gpu="h200", gpus=4, layouts="colocated, 2P2C", trace="arxiv", upload=None,
        qps_min=1, qps_max=2, qps_count=2, budget=512, prefill_budget=4096, theta=2048,
        progress="fixed:8", seeds="3, 4", num_requests=10, arrival_cv=2.0, policy="prefill-first",
        cost="analytic",
    )  # fmt: skip
    specs = setup.specs()
    assert len(specs) == 2 * 2 * 2
    assert {(s.cfg.mode, s.cfg.qps, s.cfg.seed) for s in specs} == {
        (m, q, s) for m in ("4C", "2P2C") for q in (1.0, 2.0) for s in (3, 4)
    }
    cfg = specs[0].cfg
    assert (cfg.model, cfg.gpu, cfg.gpus, cfg.budget, cfg.prefill_budget, cfg.theta) == (
        "dream-7b", "h200", 4, 512, 4096, 2048,
    )  # fmt: skip
    assert (cfg.arrival_cv, cfg.policy.value, cfg.pages) == (2.0, "prefill-first", None)
    assert specs[0].progress == "fixed:8" and specs[0].options.cost == "analytic"


def test_a_comparison_simulates_at_most_a_million_requests() -> None:
    """A point of 50,000 requests takes ~10 s to simulate on this machine: a million is minutes."""
    values = dict(
        model="llada-8b", gpu="h100", gpus=8, layouts="colocated, 5P3D", trace="sharegpt", upload=None,
        qps_min=1, qps_max=10, qps_count=10, budget=1024, prefill_budget=8192, theta=8192, progress="",
        seeds="0",
    )  # fmt: skip
    assert len(build_setup(**values, num_requests=50_000).specs()) == 20  # 1,000,000 in all
    with pytest.raises(InputError, match=r"^20 points of 50,001 requests is too many .*1,000,000"):
        build_setup(**values, num_requests=50_001)
    upload = read_uploaded_trace("t.csv", b"prompt_len,output_len\n" + b"100,64\n" * 10)
    uploaded = build_setup(**{**values, "trace": "upload", "upload": upload}, num_requests=50_001)
    assert uploaded.base.num_requests == 10  # an uploaded trace's points run its 10 rows: 200 in all


def test_the_mask_field_starts_at_what_a_run_on_the_trace_uses() -> None:
    assert [default_mask_len(t) for t in ("sharegpt", "arxiv", "upload")] == [1024, 512, 1024]
    for trace in ("sharegpt", "arxiv"):  # a run that leaves the mask buffer unset
        run = run_point(
            PointSpec(RunConfig(trace=trace, num_requests=5), options=SimOptions(cost="analytic"))
        )
        assert default_mask_len(trace) == run.summary["config"]["mask_len"]


def test_each_gpu_profile_is_labelled_by_its_provenance() -> None:
    assert profile_label("llada-8b", "h200") == "h200 profile, measured"
    assert profile_label("llada-8b", "h100") == "h100 profile, derived from h200"
    for model in ("llada-8b", "dream-7b"):  # the label says what a run's summary records
        for gpu in ("h100", "h200"):
            assert profile_label(model, gpu).endswith(resolve(RunConfig(model=model, gpu=gpu)).cost_name)


def test_an_uploaded_trace_is_checked_and_named_by_its_upload_name() -> None:
    with pytest.raises(InputError, match=r"^bad\.csv line 3: output_len must be a positive integer"):
        read_uploaded_trace("bad.csv", b"prompt_len,output_len\n10,20\n10,abc\n")
    with pytest.raises(InputError, match=r"must end in \.csv, \.jsonl or \.json"):
        read_uploaded_trace("trace.txt", b"1 2")
    trace = read_uploaded_trace("t.jsonl", b'{"arrival_time": 0.5, "prompt_len": 7, "output_len": 40}\n')
    assert trace.had_arrivals and trace.name == "t.jsonl"
    assert [(r.prompt_len, r.output_len, r.arrival_time) for r in trace.rows] == [(7, 40, None)]


def test_an_uploaded_trace_is_read_up_to_the_rows_a_point_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace of millions of rows once took seconds and a GB to parse in the page's server; only the first
    MAX_TRACE_ROWS are read, and the page says so."""
    import app.inputs

    monkeypatch.setattr(app.inputs, "MAX_TRACE_ROWS", 3)
    csv = b"prompt_len,output_len\r\n" + b"".join(b"%d,32\r\n" % n for n in range(1, 8))
    cut = read_uploaded_trace("t.csv", csv)
    assert [r.prompt_len for r in cut.rows] == [1, 2, 3] and cut.cut
    assert cut.text() == "uploaded t.csv (its first 3 rows; the file has more)"
    jsonl = b"".join(b'{"prompt_len": %d, "output_len": 32}\n' % n for n in range(1, 5))
    assert [r.prompt_len for r in read_uploaded_trace("t.jsonl", jsonl).rows] == [1, 2, 3]
    assert read_uploaded_trace("t.jsonl", jsonl).cut
    old_mac = read_uploaded_trace("t.csv", csv.replace(b"\r\n", b"\r"))  # CR line ends are cut too
    assert [r.prompt_len for r in old_mac.rows] == [1, 2, 3] and old_mac.cut
    whole = read_uploaded_trace("t.csv", b"prompt_len,output_len\n1,32\n2,32\n3,32\n")
    assert not whole.cut and whole.text() == "uploaded t.csv (3 rows)"
    with pytest.raises(InputError, match=r"^bad\.csv line 3: output_len"):  # errors still name the line
        read_uploaded_trace("bad.csv", b"prompt_len,output_len\n1,32\n2,x\n3,32\n4,32\n")


# --- sweeps -----------------------------------------------------------------------------------------


def test_the_cache_key_holds_every_value_that_decides_a_point() -> None:
    setup = resolve(RunConfig(num_requests=10))
    a, b = point_specs(setup, ["8C"], [5.0, 6.0], [0])
    assert a.key != b.key
    assert a.key == point_specs(setup, ["colocated"], [5.0], [0])[0].key
    assert PointSpec(a.cfg, "fixed:4", options=a.options).key != a.key
    assert PointSpec(a.cfg, a.progress, trace_digest="x", options=a.options).key != a.key
    assert PointSpec(a.cfg, a.progress, options=SimOptions(control_ms=1.0)).key != a.key


@pytest.mark.parametrize("cost", ["profile", "analytic"])
def test_a_point_is_what_sangam_sim_computes(tmp_path: Path, cost: str) -> None:
    args = ["sim", "--mode", "5P3C", "--qps", "9", "--num-requests", "60", "--cost", cost, "--seed", "2"]
    assert cli_main([*args, "--out", str(tmp_path)]) == 0
    expected = json.loads((tmp_path / "summary.json").read_text())
    setup = resolve(RunConfig(num_requests=60), cost)
    point = run_point(point_specs(setup, ["5P3C"], [9.0], [2])[0])
    got = point.summary
    assert got["cost_model"] == expected["cost_model"] == setup.cost_name
    assert got["config"] == expected["config"]
    for metric in METRICS:
        assert got[f"p99_{metric}_ms"] == expected[f"p99_{metric}_ms"]
        assert got[f"mean_{metric}_ms"] == expected[f"mean_{metric}_ms"]
    rows = pd.read_csv(tmp_path / "requests.csv")[list(LATENCY_COLUMNS)].to_numpy()
    np.testing.assert_allclose(point.latencies, rows, rtol=1e-12)  # the CDFs' values, each request's


def test_run_point_matches_the_simulator_and_keeps_per_worker_series() -> None:
    spec = point_specs(resolve(RunConfig(num_requests=30)), ["5P3D"], [8.0], [1])[0]
    result = run_point(spec)
    assert (result.layout, result.qps, result.seed) == ("5P3D", 8.0, 1)
    assert result.latencies.shape == (30, 3) and result.summary["completed"] == 30
    assert sorted(result.series.queue) == sorted(result.series.kv_pages) == list(range(8))
    assert max(max(levels) for levels in result.series.kv_pages.values()) > 0
    assert all(max(result.series.kv_pages[w]) > 0 for w in range(5)), "every prefill worker held KV"


def test_run_sweep_keeps_the_order_and_reports_progress() -> None:
    specs = point_specs(resolve(RunConfig(num_requests=5)), ["8C", "4P4C"], [5.0, 6.0], [0])
    done: list[tuple[int, int]] = []

    def local(spec: PointSpec, pool: Executor) -> PointResult:  # a cache that always answers
        return run_point(spec)

    results = run_sweep(specs, compute=local, on_done=lambda d, t: done.append((d, t)))
    assert [(r.layout, r.qps) for r in results] == [("8C", 5.0), ("8C", 6.0), ("4P4C", 5.0), ("4P4C", 6.0)]
    assert done == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_run_sweep_in_worker_processes_and_its_errors() -> None:
    specs = point_specs(resolve(RunConfig(num_requests=5)), ["8C"], [5.0, 6.0], [0])
    assert [r.qps for r in run_sweep(specs)] == [5.0, 6.0]
    too_small = point_specs(resolve(RunConfig(num_requests=5), given={"pages": 10}), ["8C"], [5.0], [0])
    with pytest.raises(ValueError, match="KV pages, a worker holds 10"):
        run_sweep(too_small)


def test_a_stopped_sweep_ends_its_running_points_before_it_returns() -> None:
    """Streamlit stops a replaced run by raising in its thread (here: on the first point done); the
    points still running once held both processes for their whole time (11 s here), beside the new run."""

    class Stopped(BaseException):
        pass

    def stop(done: int, total: int) -> None:
        raise Stopped

    before = set(multiprocessing.active_children())
    specs = point_specs(resolve(RunConfig(num_requests=5)), ["8C"], [5.0], [0])
    specs += point_specs(resolve(RunConfig(num_requests=1_000_000)), ["8C"], [5.0, 6.0], [0])  # minutes each
    with pytest.raises(Stopped):
        run_sweep(specs, on_done=stop)
    deadline = time.monotonic() + 60  # the pool's own thread may be the one that reaps them: until it has
    while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(multiprocessing.active_children()) - before == set()


# --- series -----------------------------------------------------------------------------------------


def test_queue_and_kv_intervals_follow_the_block_timestamps() -> None:
    blocks: list[dict[str, Any]] = [
        # colocated on worker 0: waits 0 -> 1, holds 10 pages 1 -> 3 (CSV text: blank = never happened)
        {"seq_len": "160", "dispatch": "0", "prefill_worker": "0", "prefill_start": "1", "end": "3",
         "transfer_start": "", "transfer_end": "", "decode_worker": "0"},
        # 3 pages prefilled on worker 1, moved to worker 0 over 1 -> 1.5, decoded there until 2.5
        {"seq_len": 33, "dispatch": 0.5, "prefill_worker": 1, "prefill_start": 0.5, "end": 2.5,
         "transfer_start": 1.0, "transfer_end": 1.5, "decode_worker": 0},
        # unfinished: no interval
        {"seq_len": 33, "dispatch": 2.5, "prefill_worker": 1, "prefill_start": math.nan, "end": None},
    ]  # fmt: skip
    queue, kv = block_intervals(rows_table(blocks))
    assert list(zip(queue.worker, queue.start, queue.end, queue.level, strict=True)) == [(0, 0, 1, 1)]
    assert list(zip(kv.worker, kv.start, kv.end, kv.level, strict=True)) == [
        (0, 1.0, 3.0, 10), (1, 0.5, 1.5, 3), (0, 1.0, 2.5, 3),
    ]  # fmt: skip
    assert binned_max(kv, 2, 0.0, 4.0, bins=4) == {0: (0.0, 13.0, 13.0, 0.0), 1: (3.0, 3.0, 0.0, 0.0)}
    series = worker_series(rows_table(blocks), workers=3, bins=3)
    assert series.times == (0.0, 1.0, 2.0)
    assert series.queue == {0: (1.0, 0.0, 0.0), 1: (0.0, 0.0, 0.0), 2: (0.0, 0.0, 0.0)}
    assert series.kv_pages[0] == (0.0, 13.0, 13.0)


def intervals(*rows: tuple[int, float, float, float]) -> Intervals:
    worker, start, end, level = (np.array(column, dtype=float) for column in zip(*rows, strict=True))
    return Intervals(worker, start, end, level)


def test_a_short_peak_survives_binning() -> None:
    peaks = binned_max(intervals((0, 0.0, 10.0, 1.0), (0, 4.2, 4.3, 5.0)), 1, 0.0, 10.0, bins=2)
    assert peaks == {0: (6.0, 1.0)}


def test_binned_max_matches_a_brute_force_scan() -> None:
    rng = random.Random(7)
    rows = []
    for _ in range(300):
        start = rng.uniform(0, 50)
        rows.append(
            (
                rng.randrange(3),
                start,
                start + rng.expovariate(1 / rng.choice([0.05, 2, 20])),
                rng.randint(1, 9),
            )
        )
    got = binned_max(intervals(*rows), 3, 0.0, 60.0, bins=37)
    width = 60.0 / 37
    for worker in range(3):
        mine = [r for r in rows if r[0] == worker]
        for b in range(37):
            lo, hi = b * width, (b + 1) * width
            probes = [lo] + [t for r in mine for t in (r[1], r[2]) if lo <= t < hi]
            level = max(sum(r[3] for r in mine if r[1] <= t < r[2]) for t in probes)
            assert got[worker][b] == level, (worker, b)


def test_the_sim_and_blocks_csv_give_the_same_table(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path, n=30)
    blocks = pd.read_csv(folder / "blocks.csv").merge(
        pd.read_csv(folder / "requests.csv")[["request_id", "seq_len"]], on="request_id"
    )
    from_csv = rows_table(blocks.to_dict("records"))
    setup = resolve(RunConfig(num_requests=30))
    spec = point_specs(setup, ["3P5C"], [8.0], [0])[0]
    result = simulate(spec.cfg, point_rows(spec), setup.cost)
    np.testing.assert_array_equal(record_table(result.requests), from_csv)


# --- knees and best layouts -------------------------------------------------------------------------


def test_the_knee_is_the_last_rate_before_the_first_miss() -> None:
    latency = pd.DataFrame(
        {
            "layout": ["A"] * 4 + ["B"] * 4,
            "qps": [1.0, 2.0, 3.0, 4.0] * 2,
            "mean_e2e_s": [0.5] * 8,
            "p99_e2e_s": [1.0, 2.0, 5.0, 2.4, 3.0, 3.0, 4.0, 9.0],
        }
    )
    knees = analysis.knees(latency, slo_s=2.5).set_index("layout")
    assert knees.loc["A", "knee_qps"] == 2.0 and knees.loc["A", "p99_e2e_s"] == 2.0
    assert math.isnan(knees.loc["B", "knee_qps"])
    best = analysis.best_layouts(latency, slo_s=2.5).set_index("qps")
    assert best.loc[1.0, "best_layout"] == "A" and best.loc[1.0, "meets_slo"]
    assert best.loc[3.0, "best_layout"] == "none meets the SLO"
    assert best.loc[3.0, "lowest_p99_layout"] == "B" and not best.loc[3.0, "meets_slo"]


def test_seeds_are_averaged_and_cdfs_are_capped() -> None:
    specs = point_specs(resolve(RunConfig(num_requests=12)), ["8C"], [6.0], [0, 1])
    results = [run_point(s) for s in specs]
    avg = analysis.averaged(analysis.points_frame(results))
    assert len(avg) == 1 and avg.loc[0, "seeds"] == 2
    expected = (results[0].summary["p99_e2el_ms"] + results[1].summary["p99_e2el_ms"]) / 2
    assert avg.loc[0, "p99_e2el_ms"] == pytest.approx(expected)
    requests = analysis.requests_frame(results, 6.0)
    assert len(requests) == 24
    cdf = analysis.cdf_frame(requests, "e2el")
    assert cdf["fraction"].iloc[-1] == 1.0 and cdf["seconds"].is_monotonic_increasing
    many = pd.DataFrame({"layout": "A", "e2el": range(5000)})
    assert len(analysis.cdf_frame(many, "e2el")) == analysis.CDF_POINTS
    breakdown = analysis.breakdown_frame(avg, 6.0)
    assert breakdown["seconds"].sum() == pytest.approx(avg.loc[0, "mean_e2el_ms"] / 1000)


# --- sim vs live ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("with_blocks", "extra"),
    [(True, ()), (False, ()), (True, ("--link-gbps", "5", "--control-ms", "9"))],  # a run's own link
)
def test_the_simulated_twin_of_a_run_reproduces_it(
    tmp_path: Path, with_blocks: bool, extra: tuple[str, ...]
) -> None:
    folder = sim_results_dir(tmp_path, extra=extra)
    if not with_blocks:  # then forwards come from the same seeded progress model
        (folder / "blocks.csv").unlink()
    run = load_directory(folder)
    twin = run_point(twin_spec(run))
    table = comparison_frame(run.summary, twin.summary)
    assert len(table) > 20
    assert table["sim_vs_live_pct"].abs().max() == pytest.approx(0.0, abs=1e-9)


def as_live(folder: Path, **config: Any) -> Path:
    """A simulated run's results made to read as a live run's: its summary without the simulator's own
    keys, and `config` (devices, live_model, gpu, ...) in its config."""
    summary = json.loads((folder / "summary.json").read_text())
    for key in ("testbed", "kv_link", "control_ms", "cost_model", "sim_iterations", "sim_wall_s"):
        summary.pop(key, None)
    summary["config"].update(config)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_run_is_simulated_on_its_own_model_device_and_testbed(tmp_path: Path) -> None:
    from app.live_data import twin_notes

    folder = sim_results_dir(tmp_path / "ref", extra=("--testbed", "reference-h100"))
    run = load_directory(folder)
    spec = twin_spec(run)
    assert spec.options.testbed == "reference-h100"  # a simulated run's own, so it is reproduced exactly
    table = comparison_frame(run.summary, run_point(spec).summary)
    assert table["sim_vs_live_pct"].abs().max() == pytest.approx(0.0, abs=1e-9)
    gpu = as_live(sim_results_dir(tmp_path / "gpu"), devices=["cuda:0", "cuda:0"], live_model="llada-8b",
                  gpu="h200")  # fmt: skip
    spec = twin_spec(load_directory(gpu))
    assert (spec.options.testbed, spec.cfg.gpu) == ("sangam-h200", "h200")  # our executor on its GPU
    assert "2 workers shared 1 GPU" in twin_notes(load_directory(gpu).summary)[0]
    cpu = as_live(sim_results_dir(tmp_path / "cpu"), devices=["cpu"] * 8, live_model="tiny-llada")
    with pytest.raises(InputError, match=r"served tiny-llada on 8 CPU workers: .* no twin of this run"):
        twin_spec(load_directory(cpu))
    tiny = as_live(sim_results_dir(tmp_path / "tiny"), devices=["cuda:0"], live_model="tiny-llada")
    with pytest.raises(InputError, match=r"served tiny-llada, not llada-8b: .* no twin of this run"):
        twin_spec(load_directory(tiny))
    other = as_live(sim_results_dir(tmp_path / "a100"), devices=["cuda:0"], live_model="llada-8b", gpu="a100")
    with pytest.raises(InputError, match=r"no shipped testbed models this run \(sangam-a100; known: "):
        twin_spec(load_directory(other))


def test_an_fp8_live_run_is_simulated_on_the_testbed_priced_for_fp8(tmp_path: Path) -> None:
    """A live run of `--quantization fp8 --kv-cache-dtype fp8` on an H200 twins with `sangam-h200-fp8` (its
    profile measured with FP8 weights and KV); bf16 weights, recorded or not (an older summary.json), twin
    with `sangam-h200`; weights and a KV cache no shipped testbed is priced for are refused, saying so."""
    folder = sim_results_dir(tmp_path / "run", mode="1C", n=10)

    def twin(gpu: str = "h200", **config: Any) -> PointSpec:
        live = as_live(folder, devices=["cuda:0"], live_model="llada-8b", gpu=gpu, **config)
        return twin_spec(load_directory(live))

    fp8 = twin(quantization="fp8", kv_cache_dtype="fp8")
    assert (fp8.options.testbed, fp8.cfg.kv_cache_dtype) == ("sangam-h200-fp8", "fp8")
    assert run_point(fp8).summary["cost_model"].startswith("h200-fp8-kvfp8 profile, measured, plus a loop")
    assert twin(quantization=None, kv_cache_dtype="auto").options.testbed == "sangam-h200"
    summary = json.loads((folder / "summary.json").read_text())
    del summary["config"]["quantization"]  # written before runs recorded it: bf16 weights
    (folder / "summary.json").write_text(json.dumps(summary))
    assert twin(kv_cache_dtype="auto").options.testbed == "sangam-h200"
    for quantization, kv in ((None, "fp8"), ("fp8", "auto")):
        with pytest.raises(
            InputError, match=rf"--quantization {quantization or 'none'} and --kv-cache-dtype {kv}, and no "
            "shipped testbed is priced for those"
        ):  # fmt: skip
            twin(quantization=quantization, kv_cache_dtype=kv)
    with pytest.raises(InputError, match=r"no shipped testbed models this run \(sangam-h100-fp8; known: "):
        twin("h100", quantization="fp8", kv_cache_dtype="fp8")


def test_a_request_that_stopped_early_keeps_its_blocks(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path, n=3)
    files = {name: (folder / name).read_bytes() for name in ("summary.json", "requests.csv", "blocks.csv")}
    requests = pd.read_csv(folder / "requests.csv")
    requests.loc[0, "output_len"] = 32 * (requests.loc[0, "n_blocks"] + 3)  # asked for more than it ran
    files["requests.csv"] = requests.to_csv(index=False).encode()
    rows = live_rows(load_files(files))
    first = next(r for r in rows if r.arrival_time == requests.loc[0, "arrival"])
    assert first.output_len == 32 * requests.loc[0, "n_blocks"]


def test_a_live_requests_own_mask_buffer_is_its_rows_max_tokens(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path, n=3)
    files = {name: (folder / name).read_bytes() for name in ("summary.json", "requests.csv", "blocks.csv")}
    requests = pd.read_csv(folder / "requests.csv")
    requests.loc[0, "seq_len"] = requests.loc[0, "prompt_len"] + 32 * requests.loc[0, "n_blocks"]  # sized
    files["requests.csv"] = requests.to_csv(index=False).encode()
    rows = {r.arrival_time: r for r in live_rows(load_files(files))}
    mask_len = RunConfig.from_resolved(json.loads(files["summary.json"])["config"]).mask_tokens
    for req in requests.itertuples():
        own = 32 * req.n_blocks if req.Index == 0 else mask_len
        assert rows[req.arrival].max_tokens == own


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"summary.json": b"{not json"}, "summary.json is not valid JSON"),
        ({"summary.json": b"{}"}, "no 'config' object"),
        ({"requests.csv": None}, "missing requests.csv"),
        ({"requests.csv": b"request_id,arrival\n0,1\n"}, "requests.csv lacks the column"),
        ({"blocks.csv": b"request_id,block,forwards\n0,0,\n"}, "blocks.csv: column forwards has a blank"),
        ({"p99_e2el_ms": None}, "summary.json: p99_e2el_ms must be a finite number, got None"),
        ({"completed": "40"}, "summary.json: completed must be a finite number, got '40'"),
        ({"kv_link": "fast"}, "summary.json: kv_link must be an object, got 'fast'"),
        ({"kv_link": {"gb_per_s": 25}}, "summary.json: kv_link.latency_s must be a finite number, got None"),
        ({"mean_e2el_ms": float("nan")}, "summary.json: mean_e2el_ms must be a finite number, got nan"),
        ({"completed": 10**400}, "summary.json: completed must be a finite number, got 1000"),  # past a float
    ],
)
def test_bad_live_files_say_what_is_wrong(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    folder = sim_results_dir(tmp_path, n=3)
    files = {name: (folder / name).read_bytes() for name in ("summary.json", "requests.csv", "blocks.csv")}
    for name, data in change.items():
        if name not in files:  # a value of summary.json
            summary = json.loads(files["summary.json"])
            files["summary.json"] = json.dumps({**summary, name: data}).encode()
        elif data is None:
            del files[name]
        else:
            files[name] = data
    with pytest.raises(InputError, match=message):
        load_files(files)


@pytest.mark.parametrize("forwards", ["10.9", "0", "33"])
def test_forwards_that_no_block_can_take_name_blocks_csv(tmp_path: Path, forwards: str) -> None:
    folder = sim_results_dir(tmp_path, n=3)
    files = {name: (folder / name).read_bytes() for name in ("summary.json", "requests.csv", "blocks.csv")}
    blocks = pd.read_csv(folder / "blocks.csv")
    blocks["forwards"] = blocks["forwards"].astype(object)
    blocks.loc[0, "forwards"] = forwards
    files["blocks.csv"] = blocks.to_csv(index=False).encode()
    with pytest.raises(
        InputError, match=r"^blocks\.csv: request \d+: steps must be integers in \[1, 32\], got"
    ):
        live_rows(load_files(files))


def test_a_live_config_with_unknown_values_is_refused(tmp_path: Path) -> None:
    folder = sim_results_dir(tmp_path, n=3)
    summary = json.loads((folder / "summary.json").read_text())
    summary["config"]["layout"] = "9P9Q"
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match="not a sangam config: bad mode"):
        twin_spec(load_directory(folder))
    summary["config"].update(layout="3P5C", budget="1024")
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match="not a sangam config: budget must be int, got '1024'"):
        twin_spec(load_directory(folder))
    summary["config"]["budget"] = 10**30  # a whole number, but no budget: tables' int64s overflow
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match="not a sangam config: budget must be a positive integer up to 2147"):
        twin_spec(load_directory(folder))
    with pytest.raises(InputError, match="no such results directory"):
        load_directory(tmp_path / "absent")


# --- `sangam app` -----------------------------------------------------------------------------------


def test_the_launcher_serves_on_loopback_and_imports_no_streamlit() -> None:
    command = streamlit_command(8611)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("streamlit_app.py")
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    assert command[command.index("--server.port") + 1] == "8611"
    assert command[command.index("--server.maxUploadSize") + 1] == "64"  # MB, not Streamlit's 200
    code = "import sys, app.launch; sys.exit('streamlit' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1]).returncode == 0


def test_the_launcher_refuses_a_bad_port() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_app_arguments(parser)
    with pytest.raises(ValueError, match="--port must be between 1 and 65535"):
        run_app(parser.parse_args(["--port", "70000"]))


def test_the_launcher_refuses_a_taken_port_in_one_line() -> None:
    """Checked before Streamlit starts, which would print its own lines and exit."""
    import socket

    from app.launch import check_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"^--port {port}: 127.0.0.1:{port} is taken"):
            check_port(port)
    check_port(port)  # free again


def test_a_testbed_sets_the_gpu_pages_forwards_link_and_arrivals_of_a_setup() -> None:
    common = dict(
        model="llada-8b", gpu="h100", gpus=2, layouts="1P1D", trace="arxiv", upload=None, qps_min=1,
        qps_max=1, qps_count=1, budget=1024, prefill_budget=2048, theta=8192, seeds="0", num_requests=20,
    )  # fmt: skip
    bed = load_testbed("sangam-h200")
    setup = build_setup(**common, progress="", testbed="sangam-h200")  # type: ignore[arg-type]
    (spec,) = setup.specs()
    assert (spec.cfg.gpu, spec.cfg.pages, spec.options.testbed) == ("h200", 13167, "sangam-h200")
    assert spec.progress == bed.progress_spec("llada-8b", "arxiv")
    assert spec.options.control_ms == bed.control_ms.value and spec.options.link_gbps == bed.link.gb_per_s
    assert run_point(spec).summary["cost_model"] == "measured"
    given = build_setup(**common, progress="fixed:4", testbed="sangam-h200")  # type: ignore[arg-type]
    assert given.specs()[0].progress == "fixed:4"
    with pytest.raises(InputError, match="no testbed 'nowhere'"):
        build_setup(**common, progress="", testbed="nowhere")  # type: ignore[arg-type]
