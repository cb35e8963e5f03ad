"""`--kv-cache-dtype fp8` in the page count, in `sangam sim` (pages and KV transfer bytes) and in a live
1P1D run on CPU whose KV moves as FP8 pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from live_helpers import write_trace

from cli.main import main
from executor.control.messages import Sampling, Submission
from executor.run.launcher import ClusterSpec, LocalCluster, cpu_workers
from profiles import testbeds as tb
from runs.config import RunConfig, with_arrival_times
from runs.traces import read_trace
from sangam.hardware import GPUS, KV_DTYPE_BYTES, MODELS, kv_pages, lookup_gpu, lookup_model
from sim.links import load_link
from sim.run import simulate

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("workers_per_gpu", [1, 2])
def test_fp8_pages_are_half_the_bytes_so_the_same_memory_holds_twice_as_many(
    model: str, gpu: str, workers_per_gpu: int
) -> None:
    spec = lookup_model(model)
    assert 2 * spec.page_bytes("fp8") == spec.page_bytes("auto") == spec.page_bytes()
    bf16 = kv_pages(spec, lookup_gpu(gpu), workers_per_gpu)
    fp8 = kv_pages(spec, lookup_gpu(gpu), workers_per_gpu, "fp8")
    assert bf16 > 0 and fp8 in (2 * bf16, 2 * bf16 + 1)  # the floor of twice the quotient
    config = RunConfig(model=model, gpu=gpu, kv_cache_dtype="fp8")
    assert config.kv_pages == kv_pages(spec, lookup_gpu(gpu), kv_dtype="fp8")
    assert 2 * config.kv_bytes_per_token == spec.kv_bytes_per_token()


def test_an_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="kv-cache-dtype must be one of auto, fp8, got 'fp16'"):
        RunConfig(kv_cache_dtype="fp16")
    assert set(KV_DTYPE_BYTES) == {"auto", "fp8"}


def test_a_testbeds_bf16_pages_double_for_fp8_unless_pages_are_given() -> None:
    testbed = tb.load_testbed("reference-h100")
    bf16 = tb.testbed_config(testbed, RunConfig(mode="1C"), None, {})
    fp8 = tb.testbed_config(testbed, RunConfig(mode="1C", kv_cache_dtype="fp8"), None, {})
    assert bf16.pages is not None and fp8.pages == 2 * bf16.pages
    given = tb.testbed_config(testbed, RunConfig(mode="1C", kv_cache_dtype="fp8"), None, {"pages": 100})
    assert given.pages == 100


def test_sangam_sim_with_fp8_kv_holds_twice_the_pages(tmp_path: Path) -> None:
    pages = {}
    for dtype in KV_DTYPE_BYTES:
        out = tmp_path / dtype
        args = ["sim", "--mode", "1P1D", "--model", "dream-7b", "--gpu", "h200", "-n", "20", "--qps", "1"]
        assert main([*args, "--kv-cache-dtype", dtype, "--out", str(out)]) == 0
        config = json.loads((out / "summary.json").read_text())["config"]
        assert config["kv_cache_dtype"] == dtype
        pages[dtype] = config["kv_pages"]
    assert pages["fp8"] == 2 * pages["auto"]
    assert RunConfig.from_resolved(config).kv_cache_dtype == "fp8"


def test_the_simulator_moves_fp8_kv_in_half_the_bytes(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", 20, qps=2.0, prompt=(100, 400), output=(33, 96), seed=3)
    link = load_link("cpu-gloo")
    cfg = RunConfig(
        mode="1P1D", gpus=2, trace=str(trace), num_requests=20, mask_len=128, pages=4096, kv_cache_dtype="fp8"
    )
    from profiles.analytic import AnalyticCostModel

    cost = AnalyticCostModel(cfg.model_spec, lookup_gpu(cfg.gpu))
    result = simulate(cfg, with_arrival_times(cfg, read_trace(trace)), cost, link=link)
    per_token = lookup_model("llada-8b").kv_bytes_per_token("fp8")
    moved = 0
    for req in result.requests:
        for rec in req.blocks:
            if rec.transfer_start is not None and rec.transfer_end is not None:
                seconds = link.seconds(req.seq_len * per_token)
                assert rec.transfer_end - rec.transfer_start == pytest.approx(seconds)
                moved += req.seq_len
    assert moved > 0 and result.summary["kv_transferred_gb"] == pytest.approx(moved * per_token / 1e9)


def served_logprobs(mode: str, kv_cache_dtype: str) -> list[tuple[float, ...]]:
    """The committed tokens' log-probs of three requests served one after another (so every microbatch
    holds one item): the model's logits over the KV each forward read, to the bit."""
    workers = 2 if mode == "1P1D" else 1
    spec = ClusterSpec(cpu_workers(workers), mode=mode, mask_len=64, pages=128, kv_cache_dtype=kv_cache_dtype)
    logprobs = []
    with LocalCluster(spec) as cluster:
        cluster.start(timeout=60)
        client = cluster.client
        assert client is not None
        for seed in range(3):
            prompt = tuple((7 * seed + i) % 250 + 1 for i in range(40))
            submission = Submission(prompt, 64, Sampling(logprobs=0), forwards=(3, 2))
            rid = client.submit_future(submission).result().request_id
            result = client.wait(rid, timeout=60)
            assert result.status == "DONE" and result.logprobs is not None, result.error
            logprobs.append(result.logprobs.token)
        status = client.status()
        if mode == "1P1D":
            assert status.transfers_done == 3 * 2 and status.transfers_failed == 0  # one per block
    cluster.remove_logs()
    return logprobs


def test_a_1p1d_run_moves_fp8_pages_exactly_as_a_colocated_worker_keeps_them() -> None:
    """Decoding FP8 pages received from the prefill worker gives the log-probs a colocated worker gets
    from its own FP8 pages: the transfer moved them bit for bit."""
    fp8 = served_logprobs("1P1D", "fp8")
    assert fp8 == served_logprobs("colocated", "fp8")
    assert fp8 != served_logprobs("colocated", "auto")  # and they do depend on the KV's dtype
