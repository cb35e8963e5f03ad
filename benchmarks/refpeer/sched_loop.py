"""The reference implementation's real scheduler under the paper's load, its GPU work replaced by sleeps:
per block, how long its event loop's blocking `TriggerKVTransfer` takes, how busy that loop is, and the
time from a prefill's end to the decode side getting the block (and from a block's end to its next
prefill reaching a worker).

Real (the reference's own code, unchanged): its `HybridScheduler` (`--mode hybrid`, with or without
`--enable-hybrid-prefill-overflow`: the paper's 5P3C and 5P3D) or `ColocatedScheduler`, built from its own
launch flags (`engine/launch_config.py`) and served by its own `serve_scheduler_instance` (two gRPC
servers, 4096 + 64 threads); its metrics store on; the clients' blocking `Generate`, one thread per
request, as its harness calls it; every worker RPC on its generated stubs, every report built by its own
`Batch`/`BatchRequestUpdate` and `to_proto()`.

Fake (one process per worker, no GPU): the workers' loops follow the structure of `worker/prefill_worker.py`
and `worker/colocated_worker.py` as read (docs/calibration.md, "The reference's loops"): a prefill worker's
batching loop (head always, then more while under `--max-prefill-tokens-per-batch`), its GPU call, a
synchronous report, `TriggerKVTransfer` answered at once by a thread per transfer that calls the decode
side's `ReceiveKVCache` while the send runs, under a lock per destination, then `ReportKVTransfer`; a
colocated worker's main loop (admit ready decodes, wait 10 ms on its incoming queue when idle, head-first
prefills under the deficit budget tau, one iteration, a synchronous report with every request's full
sequence), its `ReceiveKVCache` serialized per source rank. A GPU call is a sleep of the plan's
iteration-time model (`benchmarks/ref_loop_plan.py`: the testbed's profile of the reference's executor);
a KV transfer is a sleep of the plan's link time on both ends. Forwards per block are the plan's.

Runs in the reference's process, CPU only (PYTHONPATH=<reference>/src:benchmarks/refpeer/shim, plus
seaborn and ddsketch, which its metrics store imports):

    python3 benchmarks/refpeer/sched_loop.py --plan plan.json --layout 5P3D --out DIR

DIR gets `scheduler.json` (the event loop's handler times and trigger calls), `workers-*.json` (every
worker's per-block timestamps), `requests.json` (the clients' results) and `summary.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import multiprocessing as mp
import os
import queue
import re
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pricing import BLOCK, Pricing
from refpath import require_reference

MASK_ID = 126336  # LLaDA-8B's
PAGE = 16
MAX_MESSAGE = 64 * 2**20


def plan_id(sequence: Any) -> int:
    """The plan's request id, carried as the first prompt token of every sequence."""
    return int(sequence[0])


# ----- the scheduler, timed from outside -------------------------------------------------------------


def reference_config(layout: str, port: int, out: Path) -> Any:
    """The reference's launch config for the layout, from its own flags (the paper's defaults)."""
    import argparse as ap

    from sangam.engine.launch_config import add_engine_launch_args, engine_launch_config_from_namespace

    prefill, decode = parse_layout(layout)
    argv = [
        "--model",
        "llada-8b-fake",
        "--scheduler-port",
        str(port),
        "--max-gen-len",
        "1024",
        "--mask-id",
        str(MASK_ID),
        "--kv-max-pages",
        "5632",
        "--metrics-output-dir",
        str(out / "metrics"),
    ]
    if prefill:
        argv += [
            "--mode",
            "hybrid",
            "--prefill-gpus",
            ",".join(map(str, range(prefill))),
            "--hybrid-colocated-gpus",
            ",".join(map(str, range(prefill, prefill + decode))),
        ]
        argv.append(
            "--enable-hybrid-prefill-overflow"
            if layout.endswith("C")
            else "--no-enable-hybrid-prefill-overflow"
        )
    else:
        argv += ["--mode", "colocated", "--gpus", ",".join(map(str, range(decode)))]
    parser = ap.ArgumentParser()
    add_engine_launch_args(parser, include_metrics_output_dir=True)
    return engine_launch_config_from_namespace(parser.parse_args(argv))


def parse_layout(layout: str) -> tuple[int, int]:
    """(prefill workers, colocated workers) of 5P3D, 5P3C or 8C."""
    m = re.fullmatch(r"(?:(\d+)P)?(\d+)([CD])", layout)
    if not m:
        raise SystemExit(f"error: --layout {layout}: give nPmD, nPmC or nC")
    return int(m.group(1) or 0), int(m.group(2))


def run_scheduler(layout: str, port: int, out: str) -> None:
    """The scheduler process: the reference's scheduler, its handlers and outbound calls timed by a
    subclass (nothing in its tree edited); writes scheduler.json when stopped (SIGTERM)."""
    from sangam.engine import launch_config as lc
    from sangam.engine.base_scheduler import serve_scheduler_instance

    cfg = reference_config(layout, port, Path(out))
    prefill, _ = parse_layout(layout)
    if prefill:
        from sangam.engine.hybrid_scheduler import HybridScheduler as Base
        from sangam.engine.hybrid_scheduler import HybridSchedulerServicer as Servicer

        config = lc.build_hybrid_scheduler_config(cfg)
    else:
        from sangam.engine.colocated_scheduler import ColocatedScheduler as Base  # type: ignore[assignment]
        from sangam.engine.colocated_scheduler import ColocatedSchedulerServicer as Servicer  # type: ignore[assignment]

        config = lc.build_colocated_scheduler_config(cfg)

    # (event, wall start, seconds, the event loop thread's CPU seconds, seconds queued before it)
    handled: list[tuple[str, float, float, float, float]] = []
    calls: list[tuple[str, float, float, float]] = []  # (rpc, wall start, seconds, CPU seconds) on the loop
    queued: dict[int, float] = {}
    cpu: list[tuple[float, float]] = []  # (wall, the scheduler process's CPU seconds), every 0.5 s

    def sample() -> None:
        while True:
            cpu.append((time.time(), time.process_time()))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()

    class Timed(Base):  # type: ignore[misc, valid-type]
        def _enqueue_event(self, event_type: Any, payload: Any) -> None:
            queued[id(payload)] = time.perf_counter()
            super()._enqueue_event(event_type, payload)

        def _timed_grpc_call(self, stub_fn: Any, request: Any, rpc_name: str) -> Any:
            t0, w0, c0 = time.perf_counter(), time.time(), time.thread_time()
            try:
                return super()._timed_grpc_call(stub_fn, request, rpc_name)
            finally:
                calls.append((rpc_name, w0, time.perf_counter() - t0, time.thread_time() - c0))

    def timed(name: str) -> None:
        original = getattr(Base, name)

        def handler(self: Any, payload: Any) -> Any:
            t0, w0, c0 = time.perf_counter(), time.time(), time.thread_time()
            try:
                return original(self, payload)
            finally:
                t1, c1 = time.perf_counter(), time.thread_time()
                handled.append((name, w0, t1 - t0, c1 - c0, t0 - queued.pop(id(payload), t0)))

        setattr(Timed, name, handler)

    for name in ("_on_request_arrived", "_on_batch_metrics", "_on_kv_transfer", "_on_enqueue_worker_done"):
        timed(name)
    scheduler = Timed(config)
    try:
        serve_scheduler_instance(
            scheduler=scheduler,
            servicer_cls=Servicer,
            port=port,
            service_name="timed scheduler",
            startup_log_name="Timed scheduler",
            logger_instance=__import__("logging").getLogger("sched_loop"),
        )
    finally:
        Path(out, "scheduler.json").write_text(json.dumps({"handled": handled, "calls": calls, "cpu": cpu}))


# ----- fake workers ----------------------------------------------------------------------------------


class Recorder:
    """Per-block timestamps of one worker (time.time(): one host, one clock for every process)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, **row: Any) -> None:
        with self.lock:
            self.rows.append(row)


def batch_report(
    worker_id: str,
    kind: str,
    start: float,
    end: float,
    updates: list[Any],
    phase: int,
    pages_used: int,
    active: int,
    prompt: int,
    gen: int,
) -> Any:
    """The report a worker sends after every iteration, built with the reference's own classes."""
    from sangam.batch import Batch
    from sangam.proto import sangam_pb2

    state = sangam_pb2.WorkerStateSnapshot(
        state=sangam_pb2.WORKER_STATE_BUSY,
        timestamp=end,
        active_batch_size=active,
        kv_total_pages=5632,
        kv_used_pages=pages_used,
        kv_free_pages=5632 - pages_used,
    )
    return Batch(
        worker_id=worker_id,
        worker_type=kind,
        batch_size=len(updates),
        prompt_len=prompt,
        gen_len=gen,
        batch_start_time=start,
        batch_end_time=end,
        kv_total_pages=5632,
        kv_used_pages=pages_used,
        kv_free_pages=5632 - pages_used,
        num_unmasked_tokens=len(updates),
        batch_phase=phase,
        request_updates=updates,
        worker_state_after=state,
    ).to_proto()


def update(req_id: str, block: int, sequence: list[int], phase: int, completed: bool, **times: float) -> Any:
    from sangam.batch import BatchRequestUpdate

    return BatchRequestUpdate(
        request_id=req_id,
        block_index=block,
        success=True,
        updated_sequence=sequence,
        num_unmasked_tokens=1,
        num_forward_evals_in_batch_phase=1,
        request_phase=phase,
        block_completed=completed,
        **times,
    )


def serve_worker(
    kind: str, index: int, rank: int, port: int, sched_port: int, plan_path: str, out: str, layout: str
) -> None:
    """One fake worker process: registers, serves its RPCs, runs its loop until killed (SIGTERM)."""
    import signal

    import grpc
    from sangam.engine.grpc_server import create_server
    from sangam.proto import sangam_pb2, sangam_pb2_grpc

    plan = json.loads(Path(plan_path).read_text())
    STEPS.update({r["id"]: r["steps"] for r in plan["requests"]})
    pricing = Pricing(plan)
    cfg = reference_config(layout, sched_port, Path(out))
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    scheduler = sangam_pb2_grpc.SchedulerWorkerServiceStub(
        grpc.insecure_channel(f"localhost:{sched_port + 1}", options=options)
    )
    rec = Recorder()
    worker_id = f"{kind}-{index}"
    if kind == "prefill":
        servicer: Any = FakePrefill(
            worker_id, rank, cfg.max_prefill_tokens_per_batch, pricing, scheduler, rec, options
        )
        add = sangam_pb2_grpc.add_PrefillWorkerServiceServicer_to_server
    else:
        servicer = FakeColocated(
            worker_id, cfg.max_tokens_per_iteration, cfg.max_batch_size, pricing, scheduler, rec
        )
    server = create_server(16, MAX_MESSAGE)  # the reference's workers serve on 16 threads
    if kind == "prefill":
        add(servicer, server)
    else:
        sangam_pb2_grpc.add_ColocatedWorkerServiceServicer_to_server(servicer, server)
        sangam_pb2_grpc.add_DecodeWorkerServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"localhost:{port}")
    server.start()
    registered = scheduler.RegisterWorker(
        sangam_pb2.RegisterWorkerRequest(
            worker_id=worker_id,
            worker_type=kind,
            address=f"localhost:{port}",
            dist_rank=rank,
            gpu_id=rank,
            max_pages=5632 if kind == "prefill" else 5632 - 2,
            page_size=PAGE,
        ),
        wait_for_ready=True,
    )
    if not registered.success:
        raise SystemExit(f"error: {worker_id} was not registered")

    def stop(*_: Any) -> None:
        Path(out, f"workers-{worker_id}.json").write_text(json.dumps(rec.rows))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    servicer.loop()


def _servicer_bases() -> tuple[type, ...]:
    from sangam.proto import sangam_pb2_grpc

    return (
        sangam_pb2_grpc.PrefillWorkerServiceServicer,
        sangam_pb2_grpc.ColocatedWorkerServiceServicer,
        sangam_pb2_grpc.DecodeWorkerServiceServicer,
    )


class FakePrefill(*_servicer_bases()):  # type: ignore[misc]
    """A prefill worker's loop and transfer path (worker/prefill_worker.py), the GPU a sleep."""

    def __init__(
        self,
        worker_id: str,
        rank: int,
        max_tokens: int,
        pricing: Pricing,
        scheduler: Any,
        rec: Recorder,
        options: list[Any],
    ) -> None:
        self.worker_id, self.rank, self.max_tokens = worker_id, rank, max_tokens
        self.pricing, self.scheduler, self.rec, self.options = pricing, scheduler, rec, options
        self.queue: queue.PriorityQueue[Any] = queue.PriorityQueue()
        self.retained: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.dest_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
        self.stubs: dict[str, Any] = {}
        self.pages = 0

    def EnqueuePrefill(self, request: Any, context: Any) -> Any:
        from sangam.proto import sangam_pb2

        self.rec.add(event="enqueued", req=request.request_id, block=request.block_index, t=time.time())
        self.queue.put(((request.arrival_time, request.request_id), request.request_id, request))
        return sangam_pb2.EnqueuePrefillResponse(success=True)

    def TriggerKVTransfer(self, request: Any, context: Any) -> Any:
        from sangam.proto import sangam_pb2

        now = time.time()
        with self.lock:
            retained = self.retained.get(request.request_id)
        if retained is None:
            return sangam_pb2.TriggerKVTransferResponse(success=False)
        self.rec.add(event="triggered", req=request.request_id, block=request.block_index, t=now)
        threading.Thread(target=self.coordinate, args=(request, retained), daemon=True).start()
        return sangam_pb2.TriggerKVTransferResponse(success=True)

    def coordinate(self, request: Any, sequence: list[int]) -> None:
        """One transfer: the decode side's ReceiveKVCache beside the send, then the report."""
        import grpc
        from sangam.proto import sangam_pb2, sangam_pb2_grpc

        start = time.time()
        address = request.decode_worker_address
        if address not in self.stubs:
            self.stubs[address] = sangam_pb2_grpc.DecodeWorkerServiceStub(
                grpc.insecure_channel(address, options=self.options)
            )
        d = request.decode_request
        receive = sangam_pb2.ReceiveKVCacheRequest(
            request_id=request.request_id,
            src_rank=self.rank,
            num_layers=32,
            num_kv_heads=32,
            head_dim=128,
            seq_length=len(sequence),
            block_start=d.block_start,
            block_end=d.block_end,
            block_index=d.block_index,
            sequence_ids=d.sequence_ids,
            request_seed=d.request_seed,
            mask_id=d.mask_id,
            arrival_time=d.arrival_time,
            streaming=False,
            auto_enqueue_decode=True,
        )
        with self.dest_locks[request.decode_dst_rank]:
            sent = threading.Thread(target=time.sleep, args=(self.pricing.transfer(len(sequence)),))
            sent.start()  # the NCCL send, on its destination's send queue
            answer = self.stubs[address].ReceiveKVCache(receive, timeout=30)
            sent.join()
        with self.lock:
            self.retained.pop(request.request_id, None)
            self.pages -= math.ceil(len(sequence) / PAGE)
        end = time.time()
        self.scheduler.ReportKVTransfer(
            sangam_pb2.KVTransferReport(
                worker_id=self.worker_id,
                request_id=request.request_id,
                block_index=request.block_index,
                success=answer.success,
                transfer_start_time=start,
                transfer_end_time=end,
            )
        )
        self.rec.add(event="sent", req=request.request_id, block=request.block_index, t=start, end=end)

    def loop(self) -> None:
        from sangam.proto import sangam_pb2

        while True:
            try:
                _, _, first = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            batch, tokens = [(first, time.time())], len(first.sequence_ids)
            while tokens < self.max_tokens:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if tokens + len(item[2].sequence_ids) > self.max_tokens:
                    self.queue.put(item)
                    break
                batch.append((item[2], time.time()))
                tokens += len(item[2].sequence_ids)
            start = time.time()
            time.sleep(self.pricing.iteration([len(r.sequence_ids) for r, _ in batch], []))
            end = time.time()
            updates = []
            for r, dequeued in batch:
                sequence = list(r.sequence_ids)
                sequence[r.block_start] = 7  # the prefill's unmasking step commits a token
                completed = steps_of(r) == 1
                if completed:
                    sequence[r.block_start : r.block_end] = [7] * (r.block_end - r.block_start)
                else:
                    with self.lock:
                        self.retained[r.request_id] = sequence
                        self.pages += math.ceil(len(sequence) / PAGE)
                updates.append(
                    update(
                        r.request_id,
                        r.block_index,
                        sequence,
                        sangam_pb2.BATCH_PHASE_PREFILL,
                        completed,
                        prefill_duration=end - start,
                        prefill_queue_wait_duration=max(0.0, dequeued - r.prefill_enqueue_time),
                    )
                )
                self.rec.add(
                    event="prefill",
                    req=r.request_id,
                    block=r.block_index,
                    t=start,
                    end=end,
                    completed=completed,
                )
            report = batch_report(
                self.worker_id,
                "prefill",
                start,
                end,
                updates,
                sangam_pb2.BATCH_PHASE_PREFILL,
                self.pages,
                len(batch),
                tokens,
                0,
            )
            self.scheduler.ReportBatchMetrics(report)
            self.rec.add(event="reported", req="", block=-1, t=end, end=time.time(), items=len(batch))


STEPS: dict[int, list[int]] = {}


def steps_of(request: Any) -> int:
    """The plan's forwards for this request's block (its prefill included)."""
    return STEPS[plan_id(request.sequence_ids)][request.block_index]


class Decoding:
    """A request decoding its block on a colocated worker."""

    def __init__(self, proto: Any, sequence: list[int], ready: float, local: bool) -> None:
        self.proto, self.sequence, self.ready, self.local = proto, sequence, ready, local
        self.left = steps_of(proto) - 1  # decode forwards still to run
        self.started = 0.0


class FakeColocated(*_servicer_bases()):  # type: ignore[misc]
    """A colocated worker's main loop (worker/colocated_worker.py), the GPU a sleep: the decode role of
    the P/D layouts (KV received from prefill workers) and the overflow (local prefills)."""

    def __init__(
        self, worker_id: str, tau: int, max_batch: int, pricing: Pricing, scheduler: Any, rec: Recorder
    ) -> None:
        self.worker_id, self.tau, self.max_batch = worker_id, tau, max_batch
        self.pricing, self.scheduler, self.rec = pricing, scheduler, rec
        self.incoming: queue.Queue[Any] = queue.Queue()
        self.external: queue.Queue[Decoding] = queue.Queue()
        self.waiting: list[Any] = []
        self.ready: list[Decoding] = []
        self.active: list[Decoding] = []
        self.deficit = 0
        self.pages = 0
        self.lock = threading.Lock()
        self.source_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)

    def EnqueueRequest(self, request: Any, context: Any) -> Any:
        from sangam.proto import sangam_pb2

        self.rec.add(event="enqueued", req=request.request_id, block=request.block_index, t=time.time())
        self.incoming.put(request)
        return sangam_pb2.EnqueueColocatedResponse(success=True)

    def ReceiveKVCache(self, request: Any, context: Any) -> Any:
        from sangam.proto import sangam_pb2

        start = time.time()
        with self.source_locks[request.src_rank]:  # one receive queue thread per source rank
            with self.lock:
                self.pages += math.ceil(request.seq_length / PAGE)
            time.sleep(self.pricing.transfer(request.seq_length))
        end = time.time()
        self.external.put(Decoding(request, list(request.sequence_ids), end, local=False))
        self.rec.add(event="received", req=request.request_id, block=request.block_index, t=start, end=end)
        return sangam_pb2.ReceiveKVCacheResponse(success=True)

    def _drain(self) -> None:
        while True:
            try:
                r = self.incoming.get_nowait()
            except queue.Empty:
                break
            heapq.heappush(self.waiting, ((r.arrival_time, r.request_id), r.request_id, r))
        while True:
            try:
                self.ready.append(self.external.get_nowait())
            except queue.Empty:
                break
        while self.ready and len(self.active) < self.max_batch:
            d = self.ready.pop(0)
            d.started = time.time()
            self.active.append(d)
            self.rec.add(
                event="admitted",
                req=d.proto.request_id,
                block=d.proto.block_index,
                t=d.started,
                local=d.local,
            )

    def _prefills(self) -> list[Any]:
        """Head-first under the deficit budget, as colocated_worker's `_collect_prefill_batch` (memory not
        checked: the scheduler reserves pages for overflow prefills)."""
        if not self.waiting:
            self.deficit = 0
            return []
        budget = self.tau - BLOCK * len(self.active) + self.deficit
        taken, spent = [], 0
        while self.waiting:
            r = self.waiting[0][2]
            cost = len(r.sequence_ids)
            if spent + cost <= budget or (not self.active and not taken):
                heapq.heappop(self.waiting)
                taken.append(r)
                spent += cost
            else:
                break
        self.deficit = max(0, budget - spent)
        return taken

    def loop(self) -> None:
        from sangam.proto import sangam_pb2

        while True:
            self._drain()
            if not self.active and not self.waiting and not self.ready:
                with contextlib.suppress(queue.Empty):  # as its loop: wait 10 ms on the incoming queue only
                    self.incoming.put(self.incoming.get(timeout=0.01))
                continue
            prefills = self._prefills()
            decodes = [d for d in self.active if d.left > 0]
            if not prefills and not decodes:
                continue
            start = time.time()
            time.sleep(
                self.pricing.iteration(
                    [len(r.sequence_ids) for r in prefills], [len(d.sequence) for d in decodes]
                )
            )
            end = time.time()
            updates = []
            for r in prefills:
                sequence = list(r.sequence_ids)
                d = Decoding(r, sequence, end, local=True)
                completed = d.left == 0
                if not completed:
                    self.ready.append(d)
                    with self.lock:
                        self.pages += math.ceil(len(sequence) / PAGE)
                updates.append(
                    update(
                        r.request_id,
                        r.block_index,
                        sequence,
                        sangam_pb2.BATCH_PHASE_PREFILL,
                        completed,
                        prefill_duration=end - start,
                    )
                )
                self.rec.add(
                    event="prefill",
                    req=r.request_id,
                    block=r.block_index,
                    t=start,
                    end=end,
                    completed=completed,
                )
            for d in decodes:
                d.left -= 1
                completed = d.left == 0
                times = {"decode_duration": end - d.started} if completed else {}
                updates.append(
                    update(
                        d.proto.request_id,
                        d.proto.block_index,
                        d.sequence,
                        sangam_pb2.BATCH_PHASE_DECODE,
                        completed,
                        **times,
                    )
                )
                if completed:
                    with self.lock:
                        self.pages -= math.ceil(len(d.sequence) / PAGE)
                    self.rec.add(event="block_end", req=d.proto.request_id, block=d.proto.block_index, t=end)
            phase = (
                sangam_pb2.BATCH_PHASE_MIXED
                if prefills and decodes
                else sangam_pb2.BATCH_PHASE_PREFILL
                if prefills
                else sangam_pb2.BATCH_PHASE_DECODE
            )
            report = batch_report(
                self.worker_id,
                "colocated",
                start,
                end,
                updates,
                phase,
                self.pages,
                len(self.active),
                sum(len(r.sequence_ids) for r in prefills),
                BLOCK * len(decodes),
            )
            self.scheduler.ReportBatchMetrics(report)
            self.rec.add(event="reported", req="", block=-1, t=end, end=time.time(), items=len(updates))
            self.active = [d for d in self.active if d.left > 0]


# ----- the client and the run ------------------------------------------------------------------------


def client(plan: dict[str, Any], port: int, start_at: float) -> list[dict[str, Any]]:
    """Every request's blocking Generate at its arrival (a thread each, as the reference's harness)."""
    import grpc
    from sangam.proto import sangam_pb2, sangam_pb2_grpc

    channel = grpc.insecure_channel(
        f"localhost:{port}", options=[("grpc.max_receive_message_length", MAX_MESSAGE)]
    )
    stub = sangam_pb2_grpc.SchedulerServiceStub(channel)
    rows: list[dict[str, Any]] = []

    def one(r: dict[str, Any]) -> None:
        time.sleep(max(0.0, start_at + r["arrival"] - time.time()))
        prompt = [r["id"]] + [11] * (r["prompt_len"] - 1)
        request = sangam_pb2.GenerateRequest(
            prompt_token_ids=prompt, gen_length=r["output_len"], request_seed=r["id"]
        )
        request.sampling_parameters.temperature = 0.0
        request.sampling_parameters.unmasking_strategy = "conf_threshold"
        request.sampling_parameters.confidence_threshold = 0.9
        answer = stub.Generate(request, timeout=600)
        rows.append(
            {
                "id": r["id"],
                "request_id": answer.request_id,
                "status": answer.status,
                "arrival": answer.server_arrival_time,
                "complete": answer.server_complete_time,
                "blocks": len(r["steps"]),
            }
        )

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in plan["requests"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def wait_ready(port: int, workers: int | None, limit: float = 300) -> None:
    """Until the scheduler answers (`workers` None) or has registered `workers` workers."""
    import grpc
    from sangam.proto import sangam_pb2, sangam_pb2_grpc

    stub = sangam_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(f"localhost:{port}"))
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            s = stub.GetSchedulerStatus(sangam_pb2.GetSchedulerStatusRequest(), timeout=2)
            if workers is None or s.num_prefill_workers + s.num_colocated_workers == workers:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"error: the scheduler did not answer with {workers} workers in {limit:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="benchmarks/ref_loop_plan.py's JSON")
    parser.add_argument("--layout", default="5P3D", help="5P3D (disaggregated), 5P3C (hybrid) or 8C")
    parser.add_argument("--port", type=int, default=52051)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--summarize", action="store_true", help="only summarize the raw files in --out again"
    )
    args = parser.parse_args(argv)
    require_reference()
    if args.summarize:
        meta = json.loads((args.out / "summary.json").read_text())["meta"]
        summary = summarize(args.out, json.loads(args.plan.read_text()), meta)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        return 0
    prefill, decode = parse_layout(args.layout)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = json.loads(args.plan.read_text())
    Pricing(plan)
    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    procs = [ctx.Process(target=run_scheduler, args=(args.layout, args.port, str(args.out)), daemon=True)]
    procs[0].start()
    wait_ready(args.port, None)  # the reference's launcher waits 2 s; its imports take longer here
    for i in range(prefill + decode):
        kind, index = ("prefill", i) if i < prefill else ("colocated", i - prefill)
        p = ctx.Process(
            target=serve_worker,
            daemon=True,
            args=(kind, index, i, args.port + 100 + i, args.port, str(args.plan), str(args.out), args.layout),
        )
        p.start()
        procs.append(p)
    try:
        wait_ready(args.port, prefill + decode)
        start_at = time.time() + 1.0
        t0 = time.time()
        rows = client(plan, args.port, start_at)
        wall = time.time() - t0
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.join(15)
    (args.out / "requests.json").write_text(json.dumps(rows))
    meta = {
        "layout": args.layout,
        "plan": str(args.plan),
        "testbed": plan["testbed"],
        "qps": plan["qps"],
        "requests": len(plan["requests"]),
        "wall_s": wall,
        "start_at": start_at,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    summary = summarize(args.out, plan, meta)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["per_block_ms"], indent=1))
    return 0


# ----- what the run measured -------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, float] | None:
    """Mean, median, p90 and p99 (ms) of durations in seconds."""
    if not values:
        return None
    ms = sorted(v * 1000 for v in values)
    pick = lambda q: ms[min(len(ms) - 1, int(q * (len(ms) - 1)))]  # noqa: E731
    return {
        "n": len(ms),
        "mean": statistics.fmean(ms),
        "median": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
    }


def summarize(out: Path, plan: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    sched = json.loads((out / "scheduler.json").read_text())
    events: dict[tuple[str, int], dict[str, Any]] = defaultdict(dict)
    reports: list[dict[str, Any]] = []
    for path in sorted(out.glob("workers-*.json")):
        worker = path.stem.removeprefix("workers-")
        for row in json.loads(path.read_text()):
            if row["event"] == "reported":
                reports.append({**row, "worker": worker})
                continue
            events[(row["req"], row["block"])][row["event"]] = {**row, "worker": worker}
    first = meta["start_at"]
    last = first + plan["requests"][-1]["arrival"]
    window = [h for h in sched["handled"] if first <= h[1] <= last]
    span = last - first
    by_event: dict[str, list[float]] = defaultdict(list)
    cpu_by_event: dict[str, list[float]] = defaultdict(list)
    waits: list[float] = []
    for name, _, seconds, cpu, wait in window:
        by_event[name].append(seconds)
        cpu_by_event[name].append(cpu)
        waits.append(wait)
    calls = [c for c in sched["calls"] if c[0] == "TriggerKVTransfer" and first <= c[1] <= last]
    triggers = [c[2] for c in calls]
    samples = [c for c in sched["cpu"] if first <= c[0] <= last]
    process_busy = (
        (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]) if len(samples) > 1 else None
    )
    handoff, transfer, pickup, to_decode, dispatch, report_rpc = [], [], [], [], [], []
    for (req, block), ev in events.items():
        prefill, received, admitted = ev.get("prefill"), ev.get("received"), ev.get("admitted")
        if prefill and received and admitted and not prefill["completed"]:
            handoff.append(received["t"] - prefill["end"])
            transfer.append(received["end"] - received["t"])
            pickup.append(admitted["t"] - received["end"])
            to_decode.append(admitted["t"] - prefill["end"])
        end = ev.get("block_end")
        following = events.get((req, block + 1), {}).get("enqueued")
        if end and following:
            dispatch.append(following["t"] - end["t"])
    prefill_rpc = []
    for r in reports:
        report_rpc.append(r["end"] - r["t"])
        if r["worker"].startswith("prefill") and r["items"] == 1:
            prefill_rpc.append(r["end"] - r["t"])
    requests = json.loads((out / "requests.json").read_text())
    done = [r for r in requests if r["status"] == "COMPLETED"]
    seq = [r["prompt_len"] + plan["mask_len"] for r in plan["requests"]]
    return {
        "meta": {**meta, "mean_seq_len": statistics.fmean(seq)},
        "real": (
            "the reference's scheduler process (HybridScheduler or ColocatedScheduler from its launch flags, "
            "its two gRPC servers, its metrics store), its generated stubs, Batch.to_proto, blocking "
            "Generate clients"
        ),
        "sleeps": (
            "every GPU call (the plan's iteration-time model) and every KV send and receive (the plan's "
            "link); the workers' loops are fakes that follow the reference's structure (module docstring)"
        ),
        "completed": len(done),
        "mean_e2e_s": statistics.fmean(r["complete"] - r["arrival"] for r in done) if done else None,
        "event_loop_busy_fraction": sum(h[2] for h in window) / span,
        "event_loop_cpu_busy_fraction": sum(h[3] for h in window) / span,
        "scheduler_process_cpu_fraction": process_busy,
        "event_loop_handler_ms": {k: stats(v) for k, v in sorted(by_event.items())},
        "event_loop_handler_cpu_ms": {k: stats(v) for k, v in sorted(cpu_by_event.items())},
        "trigger_rpc_cpu_ms": stats([c[3] for c in calls]),
        "event_loop_queue_wait_ms": stats(waits),
        "per_block_ms": {
            "trigger_rpc_on_event_loop": stats(triggers),
            "prefill_end_to_kv_send": stats(handoff),
            "kv_transfer": stats(transfer),
            "kv_received_to_decode_admitted": stats(pickup),
            "prefill_end_to_decode_admitted": stats(to_decode),
            "block_end_to_next_prefill_enqueued": stats(dispatch),
            "worker_report_rpc": stats(report_rpc),
            "prefill_report_rpc": stats(prefill_rpc),  # a prefill worker's report of one request
        },
    }


if __name__ == "__main__":
    sys.exit(main())
