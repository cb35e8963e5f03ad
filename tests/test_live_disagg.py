"""Live disaggregated (<n>P<m>D) and hybrid (<n>P<m>C) serving on CPU: KV moves over gloo."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import time
from pathlib import Path

import pytest
from live_helpers import child_pids, live_args, replay, wait_gone, write_trace

from calib.link_fit import fit_link, recorded_command
from cli.live import run as run_live
from executor.run.launcher import (
    ClusterSpec,
    LocalCluster,
    WorkerSpec,
    cpu_workers,
    gpu_workers,
    resolve_transport,
)
from executor.run.live import page_leaks, rebuild
from runs.config import RunConfig, with_arrival_times
from runs.results import PARTS
from runs.traces import read_trace
from sangam.hardware import lookup_model
from sangam.layout import Role, parse_mode
from sim.links import LINKS_DIR, known_links, load_link
from sim.run import simulate

pytestmark = pytest.mark.timeout(120)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def opt(value: str) -> float | None:
    return float(value) if value else None


@pytest.mark.parametrize(
    ("mode", "theta", "qps"), [("1P1C", 8192, 20.0), ("2P1D", 8192, 20.0), ("1P2C", 64, 40.0)]
)
def test_disaggregated_and_hybrid_runs_move_kv_and_balance_pages(
    tmp_path: Path, mode: str, theta: int, qps: float
) -> None:
    layout = parse_mode(mode)
    n = layout.num_workers
    roles = layout.roles
    trace = write_trace(tmp_path / "trace.csv", 24, qps=qps, prompt=(4, 40), output=(33, 96), seed=5)
    out = tmp_path / "out"
    argv = [
        "--workers", str(n), "--mode", mode, "--trace", str(trace), "--num-requests", "24",
        "--mask-len", "96", "--progress", "uniform:2:4", "--theta", str(theta), "--seed", "2",
        "--transfer-timeout", "20",
        "--out", str(out), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    wall = replay(argv)

    summary = json.loads((out / "summary.json").read_text())
    requests = read_rows(out / "requests.csv")
    blocks = read_rows(out / "blocks.csv")
    assert summary["completed"] == 24 and summary["failed"] == 0
    assert summary["config"]["layout"] == mode and summary["config"]["kv_transport"] == "gloo"
    # Every worker's pool is whole again at the end (the run itself fails otherwise, too).
    ends = summary["live_workers"]
    assert [w["role"] for w in ends] == [r.value for r in roles]
    assert all(w["free_pages_at_end"] == w["pages"] for w in ends), ends

    transfers = overflows = 0
    for b in blocks:
        prefill_worker, decode_worker = int(b["prefill_worker"]), int(b["decode_worker"])
        assert int(b["forwards"]) >= 2  # so every block decodes after its prefill
        if b["overflow"] == "True":  # prefilled and decoded on one colocated worker, no KV moved
            overflows += 1
            assert roles[prefill_worker] is Role.COLOCATED and decode_worker == prefill_worker
            assert not b["transfer_start"] and not b["transfer_end"]
            continue
        transfers += 1
        assert roles[prefill_worker] is Role.PREFILL and roles[decode_worker] is not Role.PREFILL
        prefill_end, start, end = opt(b["prefill_end"]), opt(b["transfer_start"]), opt(b["transfer_end"])
        decode_start = opt(b["decode_start"])
        assert prefill_end is not None and start is not None and end is not None and decode_start is not None
        assert prefill_end <= start < end <= decode_start  # the decode begins once the KV has arrived
    assert transfers == summary["kv_transfers_done"] and summary["kv_transfers_failed"] == 0
    assert sum(int(r["kv_transfers"]) for r in requests) == transfers
    assert sum(int(r["overflow_blocks"]) for r in requests) == overflows
    if layout.n_prefill > 1:
        assert {int(b["prefill_worker"]) for b in blocks if b["overflow"] == "False"} == set(range(2))
    if theta < 100:  # every prefill is over theta: the hybrid router overflows whenever the pool is busy
        assert overflows > 0 and transfers > 0
        assert summary["overflow_rate"] == pytest.approx(overflows / len(blocks))
    else:
        assert overflows == 0
    for row in requests:
        assert math.isclose(sum(float(row[p]) for p in PARTS), float(row["e2el"]), abs_tol=1e-9)
    print(f"live {mode}: 24 requests, {transfers} transfers, {overflows} overflows, {wall:.1f} s")


def test_a_transfer_that_times_out_fails_its_request_and_the_run_goes_on(tmp_path: Path) -> None:
    """Worker 1 stalls every receive of request 0 past the 1 s transfer timeout: after three attempts the
    request ends with ERROR, both ends have freed its pages, and every other request completes. The
    results keep the iteration log's time origin although the first request failed."""
    log = tmp_path / "iterations.csv"
    spec = ClusterSpec(
        cpu_workers(2), mode="1P1D", mask_len=64, pages=128, transfer_timeout=1.0,
        fault_stall_recv=0, iteration_log=log,
    )  # fmt: skip
    before = child_pids(os.getpid())
    with LocalCluster(spec) as cluster:
        cluster.start(timeout=60)
        client = cluster.client
        assert client is not None
        ids = []
        for _ in range(5):
            ids.append(client.submit(list(range(1, 25)), 64, forwards=[3, 2]))
            time.sleep(0.2)  # arrivals apart, so that a wrong origin shows
        results = {rid: client.wait(rid, timeout=60) for rid in ids}
        deadline = time.monotonic() + 10
        while page_leaks(status := client.status()) and time.monotonic() < deadline:
            time.sleep(0.05)
        finished = rebuild(client.results(), {}, [], status.first_arrival)
        pids = set(cluster.pids)
    assert wait_gone(pids, 5.0) == set()
    assert child_pids(os.getpid()) <= before
    cluster.remove_logs()

    failed = results.pop(0)
    assert failed.status == "ERROR" and "\n" not in failed.error
    assert failed.error.startswith("KV transfer of block 0 from worker 0 to worker 1 failed after 3 attempts")
    assert "not ready" in failed.error or "gave up" in failed.error
    assert all(r.status == "DONE" and len(r.token_ids) == 64 for r in results.values())
    assert status.transfers_failed == 1 and status.transfer_retries == 2
    assert status.transfers_done == 2 * len(results)
    assert page_leaks(status) == ""
    assert [(w.free_pages, w.router_free) for w in status.workers] == [(128, 128), (128, 128)]
    prefill_starts = {float(row["start"]) for row in csv.DictReader(log.open()) if int(row["n_prefills"])}
    assert sorted(r.id for r in finished) == [1, 2, 3, 4]
    for req in finished:  # each block's prefill began at an iteration start of the log, on one clock
        for rec in req.blocks:
            assert min(abs(rec.prefill_start - s) for s in prefill_starts) < 1e-6


def test_transport_follows_the_placement() -> None:
    assert resolve_transport("auto", cpu_workers(2)) == "gloo"
    assert resolve_transport("auto", gpu_workers([0, 1])) == "nccl"
    assert resolve_transport("auto", gpu_workers([0, 0])) == "gloo"  # NCCL refuses two ranks on one GPU
    with pytest.raises(ValueError, match="one GPU"):
        resolve_transport("nccl", gpu_workers([3, 3]))
    with pytest.raises(ValueError, match="needs GPU workers"):
        resolve_transport("nccl", (WorkerSpec("cpu"),))
    assert live_args(["--gpus", "0,0"]).gpus == (0, 0)


def test_mode_must_fit_the_workers() -> None:
    with pytest.raises(ValueError, match="names 8 workers but 2 are started"):
        run_live(live_args(["--workers", "2", "--mode", "5P3C"]))


def test_link_fit_recovers_latency_and_bandwidth() -> None:
    points = [(b, 0.002 + b / 3e9) for b in (1 << 20, 1 << 24, 1 << 27, 1 << 30)]
    fit = fit_link(points)
    assert fit.gb_per_s == pytest.approx(3.0, rel=1e-6) and fit.latency_s == pytest.approx(0.002, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_error < 1e-6


def test_a_profile_records_its_command_without_the_measuring_machines_paths() -> None:
    argv = ["measure", "--name", "x", "--out", "/some/dir", "--note", "two words", "--out=/elsewhere"]
    assert recorded_command(argv) == "python -m calib.link_fit measure --name x --note 'two words'"
    for path in LINKS_DIR.glob("*.json"):
        assert " /" not in json.loads(path.read_text())["command"]  # no absolute path


def test_measured_cpu_gloo_profile_drives_the_simulated_link(tmp_path: Path) -> None:
    assert "cpu-gloo" in known_links()
    raw = json.loads((LINKS_DIR / "cpu-gloo.json").read_text())
    assert raw["transport"] == "gloo" and raw["device"] == "cpu" and len(raw["points"]) >= 4
    link = load_link("cpu-gloo")
    assert link.gb_per_s == raw["gb_per_s"] and link.latency_s == raw["latency_s"]
    assert load_link(str(LINKS_DIR / "cpu-gloo.json")) == link
    with pytest.raises(ValueError, match="no link profile"):
        load_link("no-such-link")
    for bad, message in [
        ({"gb_per_s": True, "latency_s": 0.001}, "needs a number gb_per_s, got True"),  # was taken as 1
        ({"gb_per_s": 1e-300, "latency_s": 0.001}, "0.001 GB/s or more"),  # was an OverflowError
        ([], "needs a number gb_per_s, got None"),
    ]:
        (tmp_path / "link.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=f"^{tmp_path}/link.json: .*{re.escape(message)}"):
            load_link(str(tmp_path / "link.json"))
    (tmp_path / "link.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=f"cannot read the link profile {tmp_path}/link.json"):
        load_link(str(tmp_path / "link.json"))

    trace = write_trace(tmp_path / "t.csv", 20, qps=2.0, prompt=(100, 400), output=(33, 96), seed=3)
    cfg = RunConfig(mode="1P1C", gpus=2, trace=str(trace), num_requests=20, mask_len=128, pages=4096)
    from profiles.analytic import AnalyticCostModel
    from sangam.hardware import lookup_gpu

    cost = AnalyticCostModel(cfg.model_spec, lookup_gpu(cfg.gpu))
    result = simulate(cfg, with_arrival_times(cfg, read_trace(trace)), cost, link=link)
    per_token = lookup_model("llada-8b").kv_bytes_per_token()
    for req in result.requests:
        for rec in req.blocks:
            if rec.transfer_start is not None and rec.transfer_end is not None:
                expected = link.seconds(req.seq_len * per_token)
                assert rec.transfer_end - rec.transfer_start == pytest.approx(expected)
