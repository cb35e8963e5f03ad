"""The reference-against-ours replay (benchmarks/ref_replay.py, benchmarks/refpeer/): the trace files both
sides replay, the comparison, and, where the reference's tarball is at hand (`.peer/` or `../shared/peers/`),
its checkpoint writer, replay client and report timer run in the reference's own process."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from benchmarks.ref_replay import (
    Load,
    compare_load,
    latency_stats,
    main,
    parse_loads,
    percentile,
    table,
    trace_rows,
)
from runs.traces import read_trace

REPO = Path(__file__).resolve().parent.parent
REFPEER = REPO / "benchmarks" / "refpeer"


def test_traces_share_lengths_fit_and_clip_gaps() -> None:
    low = trace_rows(Load(0.5, 30), seed=7, mask_len=512, prompt_cap=1024, clip=3.0)
    high = trace_rows(Load(1.5, 60), seed=7, mask_len=512, prompt_cap=1024, clip=3.0)
    assert len(low) == 30 and len(high) == 60
    assert [(r.prompt_len, r.output_len) for r in low] == [(r.prompt_len, r.output_len) for r in high[:30]]
    for rows, qps in ((low, 0.5), (high, 1.5)):
        times = [0.0] + [r.arrival_time for r in rows]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(0 <= g <= 3 / qps + 1e-9 for g in gaps)
        assert max(gaps) == pytest.approx(3 / qps)  # some gap was clipped: the clip is applied
        assert all(r.output_len <= 512 and r.prompt_len <= 1024 for r in rows)
    assert trace_rows(Load(0.5, 30), 7, 512, 1024, 3.0) == low
    assert trace_rows(Load(0.5, 30), 8, 512, 1024, 3.0) != low


def test_unclipped_gaps_go_past_the_clip() -> None:
    rows = trace_rows(Load(1.0, 200), seed=7, mask_len=512, prompt_cap=1024, clip=None)
    times = [0.0] + [r.arrival_time for r in rows]
    assert max(b - a for a, b in itertools.pairwise(times)) > 3.0


def test_traces_command_writes_files_sangam_reads(tmp_path: Path) -> None:
    assert main(["traces", "--out", str(tmp_path), "--loads", "2:5,4:8", "--seed", "3"]) == 0
    rows = read_trace(tmp_path / "trace-qps4.csv")
    assert len(rows) == 8 and all(r.arrival_time is not None for r in rows)
    assert len(read_trace(tmp_path / "trace-qps2.csv")) == 5


@pytest.mark.parametrize("text", ["0.5", "0.5:x", "-1:4", "1:0", "a:b"])
def test_bad_loads_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--loads"):
        parse_loads(text)


def test_bad_loads_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["traces", "--out", str(tmp_path), "--loads", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: --loads")


def test_percentile_and_stats() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile([3.0], 99) == 3.0
    stats = latency_stats([0.1, 0.2, 0.6])
    assert stats["mean"] == pytest.approx(300.0)
    assert stats["median"] == pytest.approx(200.0)
    assert stats["p99"] == pytest.approx(592.0)


def _reference_json(path: Path, latencies: list[float], failed: int = 0) -> None:
    rows = [
        {"id": i, "status": "COMPLETED", "e2el_server": v, "e2el_client": v + 0.01}
        for i, v in enumerate(latencies)
    ] + [{"id": -1, "status": "RPC_ERROR"}] * failed
    data = {"requests": len(rows), "forwards_as_forced": len(latencies), "rows": rows}
    path.write_text(json.dumps(data))


def _ours_csv(path: Path, latencies: list[float]) -> None:
    path.mkdir(parents=True)
    lines = ["request_id,e2el"] + [f"{i},{v}" for i, v in enumerate(latencies)]
    (path / "requests.csv").write_text("\n".join(lines) + "\n")


def test_compare_per_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _reference_json(tmp_path / "ref-qps0.5.json", [1.0, 2.0, 3.0], failed=1)
    _ours_csv(tmp_path / "ours-qps0.5", [0.5, 1.0, 1.5])
    _reference_json(tmp_path / "ref-qps1.5.json", [2.0, 2.0])
    _ours_csv(tmp_path / "ours-qps1.5", [1.0, 4.0])
    out = tmp_path / "compare.json"
    assert main(["compare", "--reference", str(tmp_path), "--ours", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    low = result["qps0.5"]
    assert low["requests"] == 4 and low["reference"]["completed"] == 3 and low["ours"]["completed"] == 3
    assert low["ratio"] == pytest.approx({"mean": 2.0, "median": 2.0, "p99": 2.0})
    assert low["reference"]["client_e2el_ms"]["mean"] == pytest.approx(2010.0)
    assert result["qps1.5"]["ratio"]["mean"] == pytest.approx(0.8)
    printed = capsys.readouterr().out
    assert "| qps0.5 | 3/3 of 4 | 2000 / 2000 / 2980 | 1000 / 1000 / 1490 | 2.00, 2.00, 2.00 |" in printed


def test_compare_with_nothing_to_compare_exits_2(tmp_path: Path) -> None:
    _reference_json(tmp_path / "ref-qps1.json", [1.0])
    assert main(["compare", "--reference", str(tmp_path), "--ours", str(tmp_path)]) == 2


def test_table_of_a_point() -> None:
    point = compare_load({"server": [1.0], "client": [1.1], "completed": 1, "requests": 1,
                          "forwards_as_forced": 1}, [0.5], 1)  # fmt: skip
    assert table({"qps1": point}).splitlines()[-1] == (
        "| qps1 | 1/1 of 1 | 1000 / 1000 / 1000 | 500 / 500 / 500 | 2.00, 2.00, 2.00 |"
    )


# ---- the reference's process (skipped where its tarball is not at hand) --------------------------------


def _tarball() -> Path | None:
    given = os.environ.get("SANGAM_REFERENCE_TARBALL")
    candidates = [Path(given)] if given else []
    for folder in (REPO / ".peer", REPO.parent / "shared" / "peers"):
        candidates += sorted(folder.glob("sangam-reference-*.tar.gz"))
    return next((c for c in candidates if c.is_file()), None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tarball = _tarball()
    if tarball is None:
        pytest.skip("the reference's tarball is not here (.peer/ or ../shared/peers/)")
    root = tmp_path_factory.mktemp("reference")
    with tarfile.open(tarball) as tar:
        tar.extractall(root, filter="data")
    src = next(root.glob("*/src"))
    assert (src / "sangam" / "proto" / "sangam_pb2_grpc.py").is_file()
    return src


def _run_reference(src: Path, args: list[str], shim: bool, cwd: Path, timeout: float = 120) -> str:
    """Run a script in the reference's process: its src (and the shims) on PYTHONPATH, none of ours."""
    path = [str(src)] + ([str(REFPEER / "shim")] if shim else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_checkpoint_loads_in_the_references_loader(reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    printed = _run_reference(
        reference,
        [str(REFPEER / "write_checkpoint.py"), "--out", str(out), "--tiny", "--shard-gb", "0.001", "--check"],
        True,
        tmp_path,
    )
    assert "every tensor loaded as written" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LLaDAModelLM"] and config["n_layers"] == 2
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert "model.transformer.blocks.1.q_proj.weight" in index["weight_map"]
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {p.name for p in shards}


def test_scripts_refuse_our_package(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REFPEER / "replay_client.py"), "--trace", "x", "--quota", "4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "is not the reference implementation" in done.stderr


FAKE_SCHEDULER = '''
import sys, time
from concurrent import futures
import grpc
from sangam.proto import sangam_pb2 as pb2, sangam_pb2_grpc as pb2_grpc

class Fake(pb2_grpc.SchedulerServiceServicer):
    """Completes each request after 50 ms per block with 32/quota forwards per block."""
    def GetSchedulerStatus(self, request, context):
        return pb2.GetSchedulerStatusResponse(num_colocated_workers=1, ready_for_requests=True)
    def Generate(self, request, context):
        arrival = time.time()
        blocks = -(-request.gen_length // 32)
        time.sleep(0.05 * blocks)
        quota = request.sampling_parameters.fixed_unmask_quota
        ok = request.sampling_parameters.unmasking_strategy == "conf_quota" and request.prompt_token_ids
        return pb2.GenerateResponse(
            status="COMPLETED" if ok else "ERROR", num_forward_evals=blocks * 32 // quota,
            server_arrival_time=arrival, server_start_time=arrival, server_complete_time=time.time(),
        )

server = grpc.server(futures.ThreadPoolExecutor(64))
pb2_grpc.add_SchedulerServiceServicer_to_server(Fake(), server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
sys.stdin.read()
'''


def test_replay_client_against_a_fake_scheduler(reference: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,prompt_len,output_len\n0.0,10,64\n0.05,20,33\n0.3,5,1\n")
    dry = _run_reference(reference, [str(REFPEER / "replay_client.py"), "--trace", str(trace), "--quota", "4",
                                     "--dry-run"], False, tmp_path)  # fmt: skip
    assert "3 GenerateRequests" in dry and "conf_quota quota 4" in dry
    (tmp_path / "fake.py").write_text(textwrap.dedent(FAKE_SCHEDULER))
    env = {**os.environ, "PYTHONPATH": str(reference)}
    fake = subprocess.Popen([sys.executable, "fake.py"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert fake.stdout is not None
        port = fake.stdout.readline().strip()
        out = tmp_path / "ref.json"
        _run_reference(reference, [str(REFPEER / "replay_client.py"), "--trace", str(trace), "--port", port,
                                   "--quota", "4", "--json", str(out), "--wait-ready", "30", "--warmup", "1"],
                       False, tmp_path)  # fmt: skip
    finally:
        fake.communicate("", timeout=30)
    result = json.loads(out.read_text())
    assert result["completed"] == 3 and result["forwards_as_forced"] == 3
    rows = result["rows"]
    assert [r["output_len"] for r in rows] == [64, 33, 1]
    for r, arrival, blocks in zip(rows, (0.0, 0.05, 0.3), (2, 2, 1), strict=True):
        assert r["sent"] >= arrival  # open loop: sent at its arrival time, not before
        assert r["forwards"] == blocks * 8
        assert r["e2el_client"] >= r["e2el_server"] >= 0.05 * blocks
    assert rows[1]["sent"] < rows[0]["done"]  # the second is sent while the first runs


def test_report_rpc_timer_sizes_grow_with_the_batch(reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "rpc.json"
    args = [
        "--batch-sizes",
        "1,4",
        "--seq-lens",
        "256,512",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
        str(out),
    ]
    _run_reference(reference, [str(REFPEER / "report_rpc_timer.py"), *args], False, tmp_path)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch_size"], r["seq_len"]) for r in rows] == [(1, 256), (4, 256), (1, 512), (4, 512)]
    by = {(r["batch_size"], r["seq_len"]): r for r in rows}
    assert by[4, 256]["bytes"] > 3 * by[1, 256]["bytes"] and by[1, 512]["bytes"] > by[1, 256]["bytes"]
    assert all(r["total_ms"] >= r["rpc_ms"] > 0 for r in rows)


def _ref_probe() -> Path | None:
    for candidate in (
        REPO / ".peer" / "ref_probe.py",
        REPO.parent / "shared" / "peers" / "tools" / "ref_probe.py",
    ):
        if candidate.is_file():
            return candidate
    return None


def test_peer_profile_builds_the_references_dream(reference: Path, tmp_path: Path) -> None:
    """`peer_profile.py probe --model dream-7b` through the probe's CPU dry run: the reference's DreamModel
    (2 layers, grouped KV heads) built, its KV pool, packing and worker servicer set up, our grid planned."""
    from benchmarks.peer_profile import main as peer_main

    probe = _ref_probe()
    if probe is None:
        pytest.skip("ref_probe.py is not here (.peer/ or ../shared/peers/tools/)")
    shapes = tmp_path / "shapes.json"
    assert peer_main(["shapes", "--model", "dream-7b", "--pages", "49152", "--json", str(shapes)]) == 0
    args = [
        str(REPO / "benchmarks" / "peer_profile.py"),
        "probe",
        "--model",
        "dream-7b",
        "--probe",
        str(probe),
    ]
    args += ["--shapes", str(shapes), "--", "--dry-run", "--json", str(tmp_path / "probe.json")]
    printed = _run_reference(reference, args, True, tmp_path)
    assert "DRY RUN OK" in printed
    assert "'model_class': 'DreamModel'" in printed and "'num_kv_heads': 1" in printed
    assert "106 shapes planned" in printed


def _scheduler_deps(src: Path) -> list[str]:
    """What the reference's scheduler imports beyond our environment (its metrics store: seaborn,
    ddsketch), from SANGAM_REFERENCE_DEPS; skips where they are not importable."""
    extra = [p for p in os.environ.get("SANGAM_REFERENCE_DEPS", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *extra])}
    probe = subprocess.run([sys.executable, "-c", "import seaborn, ddsketch"], env=env, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("the reference's scheduler needs seaborn and ddsketch (set SANGAM_REFERENCE_DEPS)")
    return extra


def test_sched_loop_runs_the_references_scheduler_with_fake_workers(reference: Path, tmp_path: Path) -> None:
    """1P1D, 6 requests: every block's prefill, trigger, transfer and decode went through its real scheduler
    in order, and the summary counts them."""
    from benchmarks.ref_loop_plan import main as plan_main

    extra = _scheduler_deps(reference)
    plan = tmp_path / "plan.json"
    assert plan_main(["--qps", "2", "-n", "6", "--out", str(plan)]) == 0
    requests = json.loads(plan.read_text())["requests"]
    out = tmp_path / "run"
    args = [str(REFPEER / "sched_loop.py"), "--plan", str(plan), "--layout", "1P1D", "--out", str(out),
            "--port", "53151"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(reference), *extra])}
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    moved = sum(1 for r in requests for d in r["steps"] if d > 1)  # a block done by its prefill moves no KV
    blocks = summary["per_block_ms"]
    assert summary["completed"] == len(requests)
    assert blocks["prefill_end_to_kv_send"]["n"] == blocks["prefill_end_to_decode_admitted"]["n"] == moved
    assert blocks["block_end_to_next_prefill_enqueued"]["n"] == sum(
        len(r["steps"]) - 1 for r in requests
    ) - sum(1 for r in requests for d in r["steps"][:-1] if d == 1)
    assert (
        0 < blocks["prefill_end_to_kv_send"]["median"] <= blocks["prefill_end_to_decode_admitted"]["median"]
    )
    assert 0 < summary["event_loop_cpu_busy_fraction"] <= summary["event_loop_busy_fraction"] < 1


def test_the_replay_prices_the_plans_checks_as_the_planner_does() -> None:
    """sched_loop's fake workers price the plan's check shapes (decode-only replays among them) as our cost
    model does, on a measured testbed whose graph buckets have their own lines; without the lines it would
    not, and says so in one line."""
    from benchmarks.ref_loop_plan import plan

    spec = importlib.util.spec_from_file_location("refpeer_pricing", REFPEER / "pricing.py")
    assert spec is not None and spec.loader is not None
    pricing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pricing)
    planned = plan("reference-h200", "llada-8b", 2.0, 6, 0)
    assert planned["profile"]["graph_times"] is not None
    pricing.Pricing(planned)  # exits unless every check is priced alike
    without = {**planned, "profile": {**planned["profile"], "graph_times": None}}
    with pytest.raises(SystemExit, match=r"^error: the replay prices"):
        pricing.Pricing(without)
