"""The reference's loops measured on one H200 (benchmarks/ref_loops.py, the shim refpeer/shim/ref_timing.py):
logs written by the shim's own wrappers around fakes of the reference's classes, on a fake clock, and the
analysis of them, exactly; the plans the call replays."""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.ref_loops import (
    Phase,
    analyze_logs,
    gpu_over_profile,
    main,
    prefill_end_to_send,
    read_phases,
    tables,
)
from runs.traces import read_trace

SHIM = Path(__file__).resolve().parent.parent / "benchmarks" / "refpeer" / "shim" / "ref_timing.py"
MS = 1_000_000


class Clock:
    """Nanoseconds that move only when the fakes say so."""

    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t

    def tick(self, ms: float) -> None:
        self.t += int(ms * MS)


@pytest.fixture
def shim(tmp_path: Path) -> Iterator[tuple[Any, Clock]]:
    spec = importlib.util.spec_from_file_location("ref_timing_under_test", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clock = Clock()
    module.CLOCK = clock
    yield module, clock


def _patched(shim: Any, module: str, cls: type) -> type:
    """The fake class wrapped by the shim's own patch_module, as the import hook would."""
    fake = types.ModuleType(module)
    setattr(fake, cls.__name__, cls)
    assert shim.patch_module(fake)
    return cls


class Req:
    def __init__(self, rid: str, block: int, tokens: int = 0) -> None:
        self.request_id, self.block_index, self.sequence_ids = rid, block, [0] * tokens


def _fake_colocated(clock: Clock) -> type:
    class ColocatedWorkerServicer:
        """The loop's methods, each taking a fixed time; completes the blocks named in `finishing`."""

        def __init__(self) -> None:
            self._active_batch: list[Req] = []
            self._ready: list[Req] = []
            self.finishing: set[str] = set()

        def _run_batch(self, prefill_batch: list[Req], decode_reqs: list[Req]) -> None:
            clock.tick(0.5)
            self._do_run_mixed_iteration_local(prefill_batch, decode_reqs)
            clock.tick(0.25)  # rest: bookkeeping, queue handoff
            for req in decode_reqs:
                self._block_is_complete(None, 0)
                if req.request_id in self.finishing:
                    self._do_free_state(req.request_id)
            self._make_batch_report(*([None] * 13))

        def _do_run_mixed_iteration_local(self, prefill_batch: list[Req], decode_reqs: list[Req]) -> None:
            for _ in decode_reqs:
                self._block_is_complete(None, 0)
            clock.tick(10)

        @staticmethod
        def _block_is_complete(block_tokens: Any, mask_id: int) -> bool:
            clock.tick(0.1)
            return False

        def _make_batch_report(self, *args: Any) -> None:
            clock.tick(0.5)
            self._report_batch(None)

        def _report_batch(self, batch: Any) -> None:
            clock.tick(2)

        def _do_free_state(self, req_id: str) -> None:
            clock.tick(0.05)

        def _evict_completed(self) -> None:
            for _ in self._active_batch:
                self._block_is_complete(None, 0)
            clock.tick(0.2)

        def _drain_incoming(self) -> None:
            clock.tick(0.01)

        def _drain_external_decodes(self) -> None:
            clock.tick(0.01)

        def _admit_ready_decode_requests(self) -> None:
            clock.tick(0.03)
            self._active_batch += self._ready
            self._ready = []

        def _collect_prefill_batch(self) -> None:
            clock.tick(0.4)

        def EnqueueRequest(self, request: Req, context: Any) -> None:
            clock.tick(0)

        def ReceiveKVCache(self, request: Any, context: Any) -> None:
            self._do_receive_kv_cache(request, None)

        def _do_receive_kv_cache(self, request: Any, recv_stream: Any) -> None:
            clock.tick(30)
            self._ready.append(Req(request.request_id, request.block_index))

    return ColocatedWorkerServicer


def _layers(pages: int) -> list[torch.Tensor]:
    return [torch.zeros((pages, 2, 16, 2, 4), dtype=torch.bfloat16) for _ in range(3)]  # 3 x 512 B per page


def _fake_prefill(clock: Clock) -> type:
    class PrefillWorkerServicer:
        def __init__(self) -> None:
            self._retained_lock = threading.Lock()
            self._retained_requests: dict[str, Any] = {}
            self._prefill_kv_pool = types.SimpleNamespace(kv_data=_layers(8))
            self.send_during: str | None = None

        def _process_batch(self, batch: list[tuple[Req, float]]) -> None:
            self._do_run_batched_prefill([b[0] for b in batch])
            self._report_batch(None)

        def _do_run_batched_prefill(self, batch_items: list[Req]) -> None:
            clock.tick(20)
            if self.send_during:  # a send running beside this prefill's GPU call
                self._do_transfer_retained_kv(self.send_during, 1)
            clock.tick(20)

        def _report_batch(self, batch: Any) -> None:
            clock.tick(1)

        def TriggerKVTransfer(self, request: Any, context: Any) -> None:
            clock.tick(0.2)

        def _coordinate_kv_transfer(self, request: Any) -> None:
            clock.tick(1)

        def _do_transfer_retained_kv(self, request_id: str, dst_rank: int) -> None:
            clock.tick(5)

    return PrefillWorkerServicer


def _fake_scheduler(clock: Clock) -> type:
    class HybridScheduler:
        def _timed_grpc_call(self, stub_fn: Any, request: Any, rpc_name: str) -> None:
            clock.tick(3)

        def _submit_enqueue_async(self, stub_fn: Any, request: Any, worker_id: str, worker_type: str) -> None:
            clock.tick(0.1)

        def _on_batch_metrics(self, report: Any) -> None:
            clock.tick(0.7)

        def _on_kv_transfer(self, report: Any) -> None:
            clock.tick(0.3)

        def _on_request_arrived(self, req: Any) -> None:
            clock.tick(0.2)

    return HybridScheduler


def _mark(folder: Path, clock: Clock, name: str, edge: str) -> None:
    with (folder / "phases.jsonl").open("a") as f:
        f.write(json.dumps({"name": name, "edge": edge, "t": clock()}) + "\n")


def _as_process(folder: Path, name: str) -> None:
    """The test's one process file renamed as the launcher's process `name` writes it."""
    (log,) = folder.glob("*.jsonl")
    log.rename(log.with_name(f"{name}-1.jsonl"))


def _loop_pass(worker: Any, prefills: list[Req], decodes: list[Req]) -> None:
    """One busy pass of the reference's main loop, in its order."""
    worker._drain_incoming()
    worker._drain_external_decodes()
    worker._admit_ready_decode_requests()
    worker._collect_prefill_batch()
    worker._run_batch(prefills, decodes)
    worker._evict_completed()
    worker._drain_incoming()
    worker._drain_external_decodes()
    worker._admit_ready_decode_requests()


def _colocated_logs(shim: Any, clock: Clock, folder: Path) -> None:
    shim.LOG = shim.Log(str(folder / "colocated"))
    (folder / "colocated").mkdir()
    cls = _patched(shim, "sangam.worker.colocated_worker", _fake_colocated(clock))
    worker = cls()
    a, b = Req("a", 0, 700), Req("b", 0, 700)
    _mark(folder, clock, "batch-B2-D8", "start")
    _loop_pass(worker, [a, b], [])  # prefill of both
    worker._active_batch = [a, b]
    _loop_pass(worker, [], [a, b])  # two decode-only iterations
    worker.finishing = {"a", "b"}
    _loop_pass(worker, [], [a, b])  # completes both blocks
    worker.finishing, worker._active_batch = set(), []
    clock.tick(4)  # the report's round trip through the scheduler
    worker.EnqueueRequest(Req("a", 1), None)
    worker.EnqueueRequest(Req("b", 1), None)
    _loop_pass(worker, [Req("a", 1, 700), Req("b", 1, 700)], [])
    _loop_pass(worker, [], [])
    _mark(folder, clock, "batch-B2-D8", "end")
    _as_process(folder / "colocated", "colocated-0")


def test_colocated_iterations_and_block_gap_from_the_shims_own_logs(shim: Any, tmp_path: Path) -> None:
    module, clock = shim
    _colocated_logs(module, clock, tmp_path)
    result = analyze_logs(tmp_path, None)
    rows = {(r["kind"], r["decodes_from"]): r for r in result["colocated"]["iterations"]}
    # a decode-only iteration of 2: run_batch 0.5 + GPU (2 checks 0.2 + 10) + 0.25 + checks 0.2 + report
    # 0.5 + 2; evict's 2 checks 0.2 + 0.2; drains 0.04; admits 0.06; collect 0.4
    decode = rows[("decode", 2)]
    assert decode["n"] == 2
    assert decode["gpu"] == pytest.approx(10.2)
    assert decode["gpu_checks"] == pytest.approx(0.2)
    assert decode["checks"] == pytest.approx(0.2)
    assert decode["report_rpc"] == pytest.approx(2.0)
    assert decode["report_build"] == pytest.approx(0.5)
    assert decode["rest"] == pytest.approx(0.75)
    assert decode["evict"] == pytest.approx(0.4) and decode["evict_checks"] == pytest.approx(0.2)
    assert decode["drain"] == pytest.approx(0.04) and decode["admit"] == pytest.approx(0.06)
    assert decode["collect"] == pytest.approx(0.4)
    # the completing iteration frees two blocks (0.1), then waits 4 ms for the next blocks: walls 14.55
    # and 18.65, "other" 0 and 4
    assert decode["free"] == pytest.approx(0.05) and decode["other"] == pytest.approx(2.0)
    assert decode["wall_median"] == pytest.approx((14.55 + 18.65) / 2)
    mixed_or_prefill = rows[("mixed", 0)]
    assert mixed_or_prefill["n"] == 2 and mixed_or_prefill["gpu"] == pytest.approx(10.0)
    gap = result["colocated"]["block_gaps"]["8"]
    assert gap["gap"]["n"] == 2
    # GPU end -> 0.25 rest, checks 0.2 (two) + frees 0.1, report 2.5, evict 0.4, drains/admit 0.05, 4 ms,
    # then the next pass: drains/admit 0.05, collect 0.4, run_batch's 0.5 before its GPU call
    assert gap["gap"]["median"] == pytest.approx(0.25 + 0.3 + 2.5 + 0.4 + 0.05 + 4 + 0.05 + 0.4 + 0.5)
    assert gap["to_enqueue"]["median"] == pytest.approx(0.25 + 0.3 + 2.5 + 0.4 + 0.05 + 4)
    assert "| 8 | decode | 2 | 2 |" in tables(result)
    (point,) = [p for p in result["colocated"]["loop_points"] if p["decodes"] == 2]
    # beyond the GPU call: walls 14.55 and 18.65 less 10.2; the report 2.0 + 0.5; the rest the difference
    assert (point["D"], point["n"]) == (8, 2)
    assert point["beyond_gpu"] == pytest.approx((4.35 + 8.45) / 2)
    assert point["report"] == pytest.approx(2.5) and point["rest"] == pytest.approx((4.35 + 8.45) / 2 - 2.5)
    by_phase = result["colocated"]["block_gaps_by_phase"]
    assert list(by_phase) == ["batch-B2-D8"] and by_phase["batch-B2-D8"]["gap"] == gap["gap"]


def test_an_idle_wait_is_not_an_iteration(shim: Any, tmp_path: Path) -> None:
    module, clock = shim
    module.LOG = module.Log(str(tmp_path / "colocated"))
    (tmp_path / "colocated").mkdir()
    worker = _patched(module, "sangam.worker.colocated_worker", _fake_colocated(clock))()
    _mark(tmp_path, clock, "batch-B1-D16", "start")
    _loop_pass(worker, [Req("a", 0, 10)], [])
    for _ in range(3):  # idle passes: drains and admission, then the 10 ms wait
        worker._drain_incoming()
        worker._drain_external_decodes()
        worker._admit_ready_decode_requests()
        clock.tick(10)
    _loop_pass(worker, [Req("b", 0, 10)], [])
    _loop_pass(worker, [Req("c", 0, 10)], [])
    _mark(tmp_path, clock, "batch-B1-D16", "end")
    _as_process(tmp_path / "colocated", "colocated-0")
    (row,) = analyze_logs(tmp_path, None)["colocated"]["iterations"]
    assert row["n"] == 1 and row["D"] == 16  # only b -> c; a -> b held the idle waits


def test_hybrid_trigger_transfer_wait_and_prefill_beside_a_send(shim: Any, tmp_path: Path) -> None:
    module, clock = shim
    (tmp_path / "hybrid").mkdir()
    module.LOG = module.Log(str(tmp_path / "hybrid"))
    prefill = _patched(module, "sangam.worker.prefill_worker", _fake_prefill(clock))()
    decode = _patched(module, "sangam.worker.colocated_worker", _fake_colocated(clock))()
    decode._kv_pool = types.SimpleNamespace(page_size=16, kv_data=_layers(8))
    scheduler = _patched(module, "sangam.engine.hybrid_scheduler", _fake_scheduler(clock))()
    _mark(tmp_path, clock, "hybrid-D8", "start")
    prefill._process_batch([(Req("a", 0, 1000), 0.0)])  # alone
    prefill._retained_requests["a"] = types.SimpleNamespace(
        kv_state=types.SimpleNamespace(page_ids=[1, 2, 3])
    )
    scheduler._on_batch_metrics(types.SimpleNamespace(worker_id="prefill-0"))
    scheduler._timed_grpc_call(None, Req("a", 0), "TriggerKVTransfer")
    prefill.TriggerKVTransfer(Req("a", 0), None)
    prefill.send_during = "a"
    prefill._process_batch([(Req("b", 0, 1000), 0.0)])  # beside a's send
    prefill.send_during = None
    decode._do_receive_kv_cache(types.SimpleNamespace(request_id="a", block_index=0, seq_length=40), None)
    clock.tick(7)  # the decode loop's iteration in flight
    _loop_pass(decode, [], [])
    _mark(tmp_path, clock, "hybrid-D8", "end")
    # one process here: its file named as the prefill worker's, the transfers read from every file
    _as_process(tmp_path / "hybrid", "prefill-0")
    result = analyze_logs(tmp_path, None)["hybrid"]
    t = result["transfers"]
    assert t["trigger_ms"]["n"] == 1 and t["trigger_ms"]["median"] == pytest.approx(3.0)
    assert t["trigger_handled_ms"]["median"] == pytest.approx(0.2)
    assert t["send_ms"]["median"] == pytest.approx(5.0)
    assert t["send_bytes"]["median"] == 3 * 3 * 512  # 3 pages x 3 layers x 512 B
    assert t["recv_ms"]["median"] == pytest.approx(30.0)
    assert t["received_to_admitted_ms"]["median"] == pytest.approx(7 + 0.02 + 0.03)
    # no decode iteration was running when the KV landed: the worker was idle (its 7 ms wait)
    assert t["received_to_admitted_idle_ms"]["median"] == pytest.approx(7 + 0.02 + 0.03)
    assert t["received_to_admitted_busy_ms"]["n"] == 0
    assert t["scheduler_handlers_ms"]["_on_batch_metrics"]["median"] == pytest.approx(0.7)
    (row,) = result["prefills"]
    assert (row["n_alone"], row["alone_ms"], row["n_with_send"], row["with_send_ms"]) == (1, 40.0, 1, 45.0)
    assert row["since_previous_ms"] == pytest.approx(0.7 + 3 + 0.2)  # scheduler, trigger, its handling


def test_prefill_rows_alone_and_beside_a_send(shim: Any, tmp_path: Path) -> None:
    module, clock = shim
    (tmp_path / "hybrid").mkdir()
    prefill = _patched(module, "sangam.worker.prefill_worker", _fake_prefill(clock))()
    prefill._retained_requests["a"] = types.SimpleNamespace(kv_state=types.SimpleNamespace(page_ids=[1]))
    module.LOG = module.Log(str(tmp_path / "hybrid"))
    _mark(tmp_path, clock, "burst", "start")
    prefill._process_batch([(Req("a", 0, 1280), 0.0)])
    prefill._process_batch([(Req("b", 0, 1280), 0.0)])
    clock.tick(2)
    prefill.send_during = "a"
    prefill._process_batch([(Req("c", 0, 1280), 0.0)])
    _mark(tmp_path, clock, "burst", "end")
    _as_process(tmp_path / "hybrid", "prefill-0")
    (row,) = analyze_logs(tmp_path, None)["hybrid"]["prefills"]
    assert row["phase"] == "burst" and row["tokens"] == 1280
    assert (row["n_alone"], row["alone_ms"]) == (2, pytest.approx(40.0))
    assert (row["n_with_send"], row["with_send_ms"]) == (1, pytest.approx(45.0))
    assert row["since_previous_ms"] == pytest.approx(1.0)  # b after a: 0; c after b: 2 -> median 1
    assert math.isnan(row["profile_ms"])


def test_phases_pair_marks_and_an_unfinished_one_ends_at_the_last(tmp_path: Path) -> None:
    marks = [("a", "start", 1), ("a", "end", 5), ("b", "start", 6), ("c", "start", 7), ("c", "end", 9)]
    (tmp_path / "phases.jsonl").write_text(
        "".join(json.dumps({"name": n, "edge": e, "t": t}) + "\n" for n, e, t in marks)
    )
    assert [(p.name, p.t0, p.t1) for p in read_phases(tmp_path / "phases.jsonl")] == [
        ("a", 1, 5), ("b", 6, 9), ("c", 7, 9)]  # fmt: skip


def test_plans_write_what_the_call_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plans", "--out", str(tmp_path), "--batches", "1,4", "--burst-each", "2"]) == 0
    four = read_trace(tmp_path / "batch-B4.csv")
    assert [(r.prompt_len, r.output_len, r.arrival_time) for r in four] == [(256, 192, 0.0)] * 4
    burst = read_trace(tmp_path / "burst.csv")
    assert [(r.prompt_len, r.output_len) for r in burst] == [(1024, 32), (1792, 32)] * 2
    hybrid = read_trace(tmp_path / "hybrid.csv")
    assert len(hybrid) == 20 and all(r.output_len <= 256 and r.prompt_len <= 256 for r in hybrid)
    with pytest.raises(SystemExit):
        main(["plans", "--out", str(tmp_path), "--batches", "0"])
    assert "expected positive integers" in capsys.readouterr().err


def _event(ev: str, t0: float, t1: float, **fields: Any) -> dict[str, Any]:
    return {"ev": ev, "t0": int(t0 * MS), "t1": int(t1 * MS), **fields}


def test_the_handoff_runs_from_the_prefill_batchs_end_to_its_sends_start() -> None:
    events = [
        _event("pbatch", 0, 10, prefills=[["a", 0, 100], ["b", 0, 100]], gpu=None),
        _event("send", 11, 30, rid="b"),  # an earlier transfer of b's: before its coordination, not counted
        _event("coord", 12, 40, rid="a", block=0),
        _event("coord", 12.5, 41, rid="b", block=0),
        _event("send", 13, 20, rid="a"),
        _event("send", 16, 25, rid="b"),
        _event("send", 45, 50, rid="a"),  # a's next block's send: its own transfer's is the first after
        _event("coord", 50, 60, rid="c", block=0),  # no batch made c's KV here: left out
    ]
    assert prefill_end_to_send(events) == pytest.approx([3.0, 6.0])


class _PerItem:
    """A profile whose every microbatch takes 1 ms per item."""

    def cost_model(self) -> Any:
        return types.SimpleNamespace(seconds=lambda mb: 1e-3 * (len(mb.decodes) + len(mb.prefills)))


def test_the_gpu_call_over_the_profile_per_kind_inside_the_phases_only() -> None:
    def it(t0: float, gpu_ms: float, prefills: list[list[Any]], decodes: list[list[Any]]) -> dict[str, Any]:
        gpu = {"t0": int(t0 * MS), "t1": int((t0 + gpu_ms) * MS), "parts": {}}
        return {**_event("iter", t0, t0 + gpu_ms), "gpu": gpu, "prefills": prefills, "decodes": decodes}

    events = [
        it(0, 2.0, [["a", 0, 288]], []),  # before the phase: a's tokens are learnt, no ratio
        it(10, 3.0, [["b", 0, 288]], [["a", 0]]),  # mixed: 2 items, 1 ms each
        it(20, 2.5, [], [["a", 0], ["b", 0]]),  # decode
        it(30, 4.0, [], [["z", 0]]),  # z was never prefilled: its sequence is unknown, left out
        {**it(40, 1.5, [["c", 0, 288]], []), "ev": "pbatch"},  # a prefill worker's batch
    ]
    got = gpu_over_profile(events, [Phase("batch-B2-D8", 5 * MS, 50 * MS)], _PerItem())
    assert {k: (v["n"], v["median"]) for k, v in got.items()} == {
        "decode": (1, pytest.approx(1.25)),
        "mixed": (1, pytest.approx(1.5)),
        "prefill": (1, pytest.approx(1.5)),
    }
