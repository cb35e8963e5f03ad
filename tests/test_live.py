"""Live serving on CPU through real gRPC and real processes: the tiny model, random weights."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_helpers import child_pids, descendants, live_args, replay, subprocess_env, wait_gone, write_trace

from cli.live import run as run_live
from executor.control.client import SangamClient, SangamError
from executor.control.codec import record_of, request_from_record
from executor.control.messages import RequestStatus
from executor.model.config import TINY_CONTEXT
from executor.run.launcher import ClusterSpec, LocalCluster, cpu_workers
from runs.config import RunConfig, build_requests, with_arrival_times
from runs.results import ITERATION_COLUMNS, PARTS
from runs.traces import read_trace
from sangam.progress import parse_progress
from sangam.request import BlockRecord, Request

pytestmark = pytest.mark.timeout(120)

MASK_ID, VOCAB = 299, 300  # tiny LLaDA
SERVED_MASK_LEN, SERVED_PAGES = 128, 64


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """One scheduler and one CPU worker, shared by the client-level tests."""
    log = tmp_path_factory.mktemp("served") / "iterations.csv"
    spec = ClusterSpec(cpu_workers(1), mask_len=SERVED_MASK_LEN, pages=SERVED_PAGES, iteration_log=log)
    with LocalCluster(spec) as cluster:
        cluster.start(timeout=60)
        yield cluster, log
    cluster.remove_logs()


@pytest.fixture
def client(served: tuple[LocalCluster, Path]) -> Iterator[SangamClient]:
    with SangamClient(served[0].address) as c:
        yield c


def log_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_live_replay_with_two_workers_writes_sim_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv", 30, qps=20.0, prompt=(4, 40), output=(1, 64), seed=1)
    out, iterations = tmp_path / "out", tmp_path / "iterations.csv"
    argv = [
        "--workers", "2", "--trace", str(trace), "--num-requests", "40", "--mask-len", "64",
        "--progress", "uniform:1:4", "--seed", "3", "--out", str(out), "--iteration-log", str(iterations),
        "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    wall = replay(argv)

    printed = capsys.readouterr()
    assert "sangam live" in printed.out and "2C" in printed.out
    requests = list(csv.DictReader((out / "requests.csv").open()))
    blocks = list(csv.DictReader((out / "blocks.csv").open()))
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(int(r["request_id"]) for r in requests) == list(range(30))
    assert summary["completed"] == 30 and summary["failed"] == 0
    assert summary["config"]["num_requests"] == 30  # all the trace holds, though 40 were asked for
    assert summary["config"]["workers"] == 2 and summary["config"]["mask_len"] == 64
    assert summary["config"]["quantization"] is None  # bf16 weights (float32 on CPU)
    for row in requests:
        parts = sum(float(row[p]) for p in PARTS)
        assert math.isclose(parts, float(row["e2el"]), rel_tol=1e-9, abs_tol=1e-9)
        assert float(row["e2el"]) > 0

    # The forced schedule: each block took exactly the forwards the progress model planned (as in sim).
    cfg = RunConfig(gpus=2, trace=str(trace), num_requests=30, mask_len=64, pages=4096, seed=3)
    planned = build_requests(cfg, with_arrival_times(cfg, read_trace(trace)), parse_progress("uniform:1:4"))
    used = {(int(b["request_id"]), int(b["block"])): int(b["forwards"]) for b in blocks}
    assert used == {(r.id, b): d for r in planned for b, d in enumerate(r.steps)}
    assert {int(b["prefill_worker"]) for b in blocks} == {0, 1}

    rows = log_rows(iterations)
    assert list(rows[0]) == [*ITERATION_COLUMNS, "gpu_s", "items", "cycle_s"]
    for worker in {row["worker"] for row in rows}:  # a cycle runs from an iteration to the next start
        own = sorted((r for r in rows if r["worker"] == worker), key=lambda r: float(r["start"]))
        cycles = [(a, float(a["cycle_s"]), float(b["start"])) for a, b in itertools.pairwise(own)]
        assert any(cycle > 0 for _, cycle, _ in cycles) and float(own[-1]["cycle_s"]) == 0
        for row, cycle, following in cycles:
            if cycle > 0:
                # the loop's next start lies between this iteration's end and the next one's own start
                assert float(row["end"]) <= float(row["start"]) + cycle <= following
    items = sum(int(row["n_prefills"]) + int(row["n_decodes"]) for row in rows)
    assert items == sum(used.values())  # every forward of every block is one item of one iteration
    for row in rows:
        budget = float(row["budget"])
        assert budget == 1024 - int(row["decode_tokens"]) + int(row["deficit_before"])
        kinds = [item.split(":")[0] for item in row["items"].split(";")]
        assert kinds.count("p") == int(row["n_prefills"]) and kinds.count("d") == int(row["n_decodes"])
        assert float(row["gpu_s"]) > 0
    print(f"live replay: 30 requests, 2 workers, {wall:.1f} s", file=sys.stderr)


def test_a_replay_sizes_each_request_by_its_traces_max_tokens_as_the_simulator_does(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = [(10, 40, "64"), (12, 20, "100"), (14, 30, ""), (16, 1, "1")]  # prompt, output, max_tokens
    lines = [f"{0.05 * i},{p},{o},{m}" for i, (p, o, m) in enumerate(rows)]
    trace.write_text("\n".join(["arrival_time,prompt_len,output_len,max_tokens", *lines]) + "\n")
    out, iterations = tmp_path / "out", tmp_path / "iterations.csv"
    argv = [
        "--workers", "1", "--trace", str(trace), "--mask-len", "256", "--progress", "fixed:2",
        "--out", str(out), "--iteration-log", str(iterations), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    replay(argv)
    requests = sorted(csv.DictReader((out / "requests.csv").open()), key=lambda r: int(r["request_id"]))
    expected = [10 + 64, 12 + 128, 14 + 256, 16 + 32]  # max_tokens in whole blocks; none: --mask-len
    assert [int(r["seq_len"]) for r in requests] == expected
    cfg = RunConfig(trace=str(trace), mask_len=256, pages=4096)
    simulated = build_requests(cfg, with_arrival_times(cfg, read_trace(trace)), parse_progress("fixed:2"))
    assert [r.seq_len for r in simulated] == expected  # the one rule both drivers apply
    contexts = {item.split(":")[2] for row in log_rows(iterations) for item in row["items"].split(";")}
    assert {int(c) for c in contexts} == set(expected)  # what the worker's forwards ran over


def test_bad_inputs_get_errors_and_leave_others_untouched(client: SangamClient) -> None:
    good = client.submit([5, 6, 7, 8], 64)
    too_long = SERVED_PAGES * 16 - 32 + 1  # beside a gen length of 32: its own mask buffer
    bad = {
        "empty prompt": ([], 64),
        "not a positive multiple of 32": ([1, 2], 40),
        "gen length 0 is not": ([1, 2], 0),
        "exceeds the mask buffer": ([1, 2], SERVED_MASK_LEN + 32),
        "prompt too long for the KV pool": ([1] * too_long, 32),
        "too long for the model's context window": ([1] * (TINY_CONTEXT - 32 + 1), 32),
        "outside the vocabulary": ([1, VOCAB], 32),
        "token -3 at position 2": ([1, 2, -3], 32),
        "is the mask id": ([1, MASK_ID, 2], 32),
    }
    replies = {reason: client.submit_reply(prompt, gen) for reason, (prompt, gen) in bad.items()}
    also_good = client.submit([1] * (too_long - 1), 32)
    for reason, reply in replies.items():
        assert reply.status is RequestStatus.ERROR and reason in reply.error, (reason, reply.error)
        polled = client.poll(reply.request_id)
        assert polled.status == "ERROR" and polled.error == reply.error
        assert "\n" not in reply.error
    for rid, gen_len in ((good, 64), (also_good, 32)):
        result = client.wait(rid, timeout=60)
        assert result.status == "DONE", result.error
        assert len(result.token_ids) == gen_len and MASK_ID not in result.token_ids
    bad_plan = client.submit_reply([1, 2], 64, forwards=[3])
    assert bad_plan.status is RequestStatus.ERROR and "planned forwards" in bad_plan.error
    assert client.poll(10**9).status == "NOT_FOUND"


def test_forced_schedule_runs_each_block_in_exactly_its_forwards(
    client: SangamClient, served: tuple[LocalCluster, Path]
) -> None:
    log = served[1]
    planned = [3, 1, 7, 2]
    before = len(log_rows(log))
    result = client.wait(client.submit(list(range(10, 30)), 32 * len(planned), forwards=planned), timeout=60)
    assert result.status == "DONE" and result.forwards == tuple(planned)
    rows = log_rows(log)[before:]
    assert len(rows) == sum(planned)  # one iteration per forward: a prefill, then d - 1 decodes, per block
    kinds = [row["items"].split(":")[0] for row in rows]
    expected = [k for d in planned for k in ["p", *["d"] * (d - 1)]]
    assert kinds == expected
    context = 20 + SERVED_MASK_LEN
    assert all(row["items"].endswith(f":{context}") for row in rows)
    record = next(r for r in client.results() if r.id == result.request_id)
    assert list(record.steps) == planned and len(record.blocks) == len(planned)


def test_client_submit_stream_poll_wait(client: SangamClient) -> None:
    rid = client.submit([7, 8, 9], 64, threshold=0.9, temperature=0.0, seed=5)
    updates = list(client.stream(rid, timeout=60))
    assert updates[-1].status == "DONE"
    done = [u.blocks_done for u in updates]
    assert done == sorted(done) and done[-1] == 2
    for update in updates:
        assert len(update.token_ids) == 32 * update.blocks_done
    final = updates[-1]
    assert final.n_blocks == 2 and len(final.token_ids) == 64 and final.end is not None
    assert final.end > final.arrival
    # Random weights are never confident: the threshold commits one token per forward.
    assert final.forwards == (32, 32)
    assert client.poll(rid) == final
    assert client.wait(rid, timeout=10) == final
    status = client.status()
    assert status.ready and status.facts is not None
    assert status.facts.vocab == VOCAB and status.facts.mask_id == MASK_ID
    assert status.mask_len == SERVED_MASK_LEN and status.facts.pages == SERVED_PAGES


def test_record_round_trip_keeps_every_time() -> None:
    req = Request(4, 10.0, 20, 64, 128, (2, 1))
    req.blocks[0] = BlockRecord(
        ready=10.0, dispatch=10.1, prefill_worker=1, prefill_start=10.2, prefill_end=10.3, decode_worker=1,
        decode_start=10.35, end=10.5,
    )  # fmt: skip
    req.end_block(10.5)
    req.record.dispatch, req.record.prefill_worker, req.record.prefill_start = 10.6, 0, 10.7
    req.record.prefill_end = 10.8
    req.end_block(10.8)
    back = request_from_record(record_of(req), shift=10.0)
    assert back.finished and back.steps == req.steps and back.arrival == 0.0
    assert back.blocks[0].decode_worker == 1 and back.blocks[1].decode_start is None
    assert math.isclose(back.blocks[1].end or 0, 0.8)


def test_a_live_runs_summary_records_its_quantization(tmp_path: Path) -> None:
    """What the explorer twins a run by, and what `sangam profile --from-log` checks a log's run against."""
    trace = write_trace(tmp_path / "trace.csv", 4, qps=20.0, prompt=(4, 40), output=(1, 64), seed=2)
    out = tmp_path / "out"
    argv = [
        "--workers", "1", "--trace", str(trace), "--mask-len", "64", "--progress", "fixed:2",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--out", str(out),
        "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    replay(argv)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 4
    assert (summary["config"]["quantization"], summary["config"]["kv_cache_dtype"]) == ("fp8", "fp8")


def test_unsupported_mode_and_short_mask_are_usage_errors(tmp_path: Path) -> None:
    before = child_pids(os.getpid())
    with pytest.raises(ValueError, match="names 8 workers but 2 are started"):  # 5P3C runs live: issue 4
        run_live(live_args(["--workers", "2", "--mode", "5P3C"]))
    trace = write_trace(tmp_path / "t.csv", 3, qps=5.0, prompt=(4, 8), output=(100, 120), seed=0)
    with pytest.raises(ValueError, match="raise --mask-len"):
        run_live(
            live_args(["--workers", "1", "--trace", str(trace), "--num-requests", "3", "--mask-len", "64"])
        )
    assert child_pids(os.getpid()) == before


def test_the_death_of_the_only_worker_fails_the_cluster_with_one_line() -> None:
    with LocalCluster(ClusterSpec(cpu_workers(1), mask_len=64)) as cluster:
        cluster.start(timeout=60)
        worker = cluster.children[1]
        assert worker.name == "worker 0"
        os.kill(worker.proc.pid, signal.SIGKILL)
        assert cluster.client is not None
        deadline = time.monotonic() + 15
        while not (status := cluster.client.status()).failure and time.monotonic() < deadline:
            cluster.check()  # the scheduler lives on
            time.sleep(0.1)
        assert status.failure == "worker 0 lost (its process was killed by SIGKILL) and 1C has no worker left"
        with pytest.raises(SangamError, match=r"UNAVAILABLE.*worker 0 lost"):
            cluster.client.submit([1, 2], 32)
        assert cluster.exits == [f"worker 0 (pid {worker.proc.pid}) was killed by SIGKILL"]
        pids = set(cluster.pids)
    assert wait_gone(pids, 5.0) == set()
    cluster.remove_logs()


def _read_until(stream: object, needle: str, timeout: float) -> str:
    """Lines of a child's pipe until one contains `needle` (read on a thread, so a timeout works)."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            seen.append(line)
            if needle in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"no {needle!r} within {timeout} s: {''.join(seen)!r}"
    return "".join(seen)


@pytest.mark.parametrize(
    ("case", "workers"), [("serve-ctrl-c", 1), ("replay-ctrl-c", 2), ("launcher-killed", 1)]
)
def test_no_process_outlives_the_launcher(tmp_path: Path, case: str, workers: int) -> None:
    trace = write_trace(tmp_path / "long.csv", 400, qps=20.0, prompt=(4, 40), output=(32, 64), seed=2)
    serve = case != "replay-ctrl-c"
    argv = ["--workers", str(workers), "--mask-len", "64", "--log-dir", str(tmp_path / "logs")]
    argv += ["--serve", "--port", "0"] if serve else ["--trace", str(trace), "--num-requests", "400"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "live", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        # a suite run as a background job inherits SIGINT ignored, and Python then keeps ignoring it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _read_until(launcher.stdout if serve else launcher.stderr, "serving" if serve else "replaying", 60)
        if not serve:
            time.sleep(0.5)  # mid-replay
        children = descendants(launcher.pid)
        assert len(children) == 1 + workers  # the scheduler and the workers
        launcher.send_signal(signal.SIGKILL if case == "launcher-killed" else signal.SIGINT)
        code = launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert code == {"serve-ctrl-c": 0, "replay-ctrl-c": 130, "launcher-killed": -signal.SIGKILL}[case]
    assert wait_gone(children, 10.0) == set(), "processes outlived the launcher"


@pytest.mark.parametrize(
    ("requests", "needle"),
    [(400, "submitting request"), (6, "the scheduler stopped answering")],  # mid-replay; after it
)
def test_an_unresponsive_scheduler_ends_the_run_with_one_line(
    tmp_path: Path, requests: int, needle: str
) -> None:
    # 400 short requests take 20 s to submit; 6 long ones (32 blocks of 32 forwards each) all are in 0.3 s
    # and still running seconds later
    output, mask = ((32, 64), "64") if requests > 100 else ((1000, 1024), "1024")
    trace = write_trace(tmp_path / "t.csv", requests, qps=20.0, prompt=(4, 40), output=output, seed=2)
    argv = ["--workers", "1", "--mask-len", mask, "--trace", str(trace), "--num-requests", str(requests)]
    argv += [] if requests > 100 else ["--progress", "fixed:32"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "live", *argv, "--log-dir", str(tmp_path / "logs")],
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        _read_until(launcher.stderr, "replaying", 60)
        time.sleep(0.5 if requests > 100 else 1.0)  # mid-replay; all 6 submitted (at 20 QPS), none done
        children = descendants(launcher.pid)
        (scheduler,) = (
            p
            for p in children
            if b"executor.control.scheduler_service" in Path(f"/proc/{p}/cmdline").read_bytes()
        )
        assert launcher.poll() is None  # the run is still going
        os.kill(scheduler, signal.SIGSTOP)  # alive, answering nothing: each call runs into its deadline
        code = launcher.wait(timeout=60)
        err = launcher.stderr.read() if launcher.stderr else ""
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert code == 1
    (line,) = [x for x in err.splitlines() if x.startswith("sangam: error:")]
    assert needle in line and "DEADLINE_EXCEEDED" in line and "Traceback" not in err
    assert wait_gone(children, 10.0) == set(), "processes outlived the launcher"


def test_fastdllm_live_serves_one_request_at_a_time(tmp_path: Path) -> None:
    """Batch size 1 live too: on its worker, no request starts before the one before it has ended."""
    trace = write_trace(tmp_path / "t.csv", 6, qps=50.0, prompt=(4, 40), output=(64, 96), seed=3)
    out = tmp_path / "out"
    replay(
        [
            "--workers",
            "1",
            "--trace",
            str(trace),
            "--mask-len",
            "128",
            "--policy",
            "fastdllm",
            "--out",
            str(out),
        ]
    )
    with (out / "blocks.csv").open() as f:
        blocks = list(csv.DictReader(f))
    spans: dict[str, tuple[float, float]] = {}
    for b in blocks:
        start, end = float(b["prefill_start"]), float(b["end"])
        first, last = spans.get(b["request_id"], (start, end))
        spans[b["request_id"]] = (min(first, start), max(last, end))
    ordered = sorted(spans.values())
    assert len(ordered) == 6
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(ordered))
