"""A live worker process: a gRPC front end and one loop thread that drives an `executor.worker.engine.Engine`.

    python -m executor.worker.process < spec.json   # an executor.control.process_specs.WorkerLaunch on stdin

Threads:
- gRPC handlers (`Enqueue`, `Shutdown`, grpc.health.v1) validate and push blocks and drops onto a
  thread-safe inbox (a drop applies to the work of earlier calls); transfer orders they start at once
  (under `Engine.lock`); `Enqueue` and `Shutdown` need the run's secret (`executor.control.auth`), which the
  worker also presents on every call to the scheduler;
- the loop thread (the main thread) drives the Engine: drain inbox -> admit -> `Engine.step` -> hand the
  iteration's report to the outbox. It never waits on the scheduler or the network; the Batcher and its
  pool change only under `Engine.lock`, which the forward does not hold;
- KV link threads (disaggregated and hybrid layouts) move KV, then hand a received block to the Engine;
- the sender thread (`executor.worker.report_sender`) batches reports and transfer events into
  `Control.Report` calls, with heartbeats when idle; a report the scheduler refuses (this process was
  declared lost) stops the worker;
- the hang watch (`executor.worker.hang_watch`) marks the worker unhealthy if one iteration runs too long.

Disaggregated and hybrid layouts (`--mode <n>P<m>D|C`) give each worker a role; a prefill worker's
Batcher hands prefilled blocks off (its prefill budget) and `TransferOrder`s arrive through
`Enqueue`. Transfer results go out as `TransferEvent`s in the same report stream, each batch also carrying
the pool's free pages.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace

import grpc
import torch

from executor.control import auth, codec, rpc
from executor.control.admission import check_work
from executor.control.messages import (
    BlockWork,
    DropOrder,
    IterationReport,
    Registered,
    Registration,
    WorkBatch,
)
from executor.control.process_specs import WorkerLaunch, read_spec
from executor.model.kv_cache import PagedKVCache, kv_dtype
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc
from executor.transfer.links import KVTransfers, LinkConfig, TransferResult, open_store
from executor.worker.engine import Engine, build_model, build_runner
from executor.worker.hang_watch import watch_for_hangs
from executor.worker.report_sender import ReportSender
from sangam.batcher import Batcher
from sangam.budget import BatchConfig, Policy
from sangam.hardware import pages_for
from sangam.kv import PagePool
from sangam.layout import Kind, Role, parse_mode

STAGED_TOKENS = 4096 + 1024  # transfer staging is allocated up front for a sequence this long

log = logging.getLogger("sangam.worker")


class WorkerServicer(pb_grpc.WorkerServicer):
    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker

    def Enqueue(self, request: pb.EnqueueBatch, context: grpc.ServicerContext) -> pb.EnqueueReply:
        batch = codec.from_pb(request, WorkBatch)
        for work in batch.blocks:
            reason = check_work(work)
            if reason is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        if self.worker.stopping.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        with self.worker.calls_lock:  # the scheduler's sender makes one call at a time: keeps its order
            call = next(self.worker.calls)
            if batch.drops or batch.blocks:
                self.worker.inbox.put((call, [*batch.drops, *batch.blocks]))
            for order in batch.orders:  # right away, in the order the scheduler issued them
                self.worker.engine.transfer(order, call)
        if batch.orders:
            self.worker.wake()  # a RELEASE may let a waiting prefill in
        return pb.EnqueueReply(accepted=len(batch.blocks) + len(batch.orders) + len(batch.drops))

    def Shutdown(self, request: pb.ShutdownRequest, context: grpc.ServicerContext) -> pb.ShutdownReply:
        self.worker.stop("shutdown requested")
        return pb.ShutdownReply()


Inbound = tuple[int, list[DropOrder | BlockWork]]  # an Enqueue call's number, its drops and blocks


class WorkerProcess:
    """The loop around one `Engine`: its inbox of blocks and drops, and its reports' sender."""

    def __init__(self, worker_id: int, engine: Engine, control: pb_grpc.ControlStub) -> None:
        self.worker_id = worker_id
        self.engine = engine
        self.inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()  # an empty list only wakes the loop
        self.calls = itertools.count(1)  # Enqueue calls, numbered as they come
        self.calls_lock = threading.Lock()
        self.stopping = threading.Event()
        self.failure: str | None = None
        self.step_started: float | None = None  # when the iteration in progress began
        pool = engine.batcher.pool
        self.sender = ReportSender(worker_id, control, lambda: pool.num_free, self.stopping, self.fail)
        engine.emit = self.sender.outbox.put

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log.info("stopping: %s", why)
        self.stopping.set()

    def fail(self, why: str) -> None:
        self.failure = self.failure or why
        self.stop(why)

    def run(self) -> None:
        """The loop thread; returns when stopped."""
        self.sender.start()
        outbox = self.sender.outbox
        batcher = self.engine.batcher
        # An iteration's report goes out once the next iteration's GPU work is queued (or the loop has
        # nothing to run): the sender's Python then runs while this thread waits on the GPU, instead of
        # holding the GIL through the next iteration's host work. It reaches the scheduler no later than
        # it could matter: a block dispatched meanwhile could not join the iteration already started.
        # The last held report learns its cycle (start to this loop's next start) when the loop goes
        # straight on to the next iteration.
        held: list[IterationReport] = []
        straight_on = False

        def release() -> None:
            if straight_on and held and self.step_started is not None:
                held[-1] = replace(held[-1], cycle_s=self.step_started - held[-1].stats.start)
            for report in held:
                outbox.put(report)
            held.clear()

        try:
            while not self.stopping.is_set():
                straight_on = batcher.has_work
                if not straight_on:
                    release()
                self._drain(wait=not batcher.has_work)
                if not batcher.has_work:
                    continue
                self.step_started = time.monotonic()
                report = self.engine.step(on_launch=release)
                self.step_started = None
                if report is None:  # nothing could run (cannot happen with validated requests)
                    time.sleep(0.001)
                    continue
                held.append(report)
        finally:
            release()
            self.sender.finish(timeout=2.0)

    def on_transfer(self, result: TransferResult) -> None:
        """From a link thread: a received block can decode now; wake the loop if it idles."""
        self.engine.transfer_done(result)
        self.wake()

    def wake(self) -> None:
        self.inbox.put((0, []))

    def _drain(self, wait: bool) -> None:
        """Admit queued blocks and apply drops (between iterations: no forward uses their pages now)."""
        try:
            call, items = self.inbox.get(timeout=0.05) if wait else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            for item in items:
                if isinstance(item, DropOrder):
                    self.engine.drop(item.request_id, before=call)
                else:
                    self.engine.admit(item, call)
            try:
                call, items = self.inbox.get_nowait()
            except queue.Empty:
                return


def described(device: torch.device) -> str:
    """The device as the worker registers it: `cpu`, or `cuda:0 (NVIDIA H200)`."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def connect_links(args: WorkerLaunch, roles: Sequence[Role], device: torch.device) -> KVTransfers:
    """Connect to the rendezvous store (the launcher hosts it) and build this worker's KV links."""
    if args.dist_port <= 0:
        raise ValueError("a disaggregated or hybrid layout needs --dist-port (the KV rendezvous store)")
    if args.kv_transport == "nccl" and device.type != "cuda":
        raise ValueError("the nccl KV transport needs a CUDA device")
    if args.kv_transport == "nccl":
        os.environ.setdefault(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"
        )  # a timed-out link is aborted, not fatal
        torch.cuda.set_device(device)
    me = args.worker_id
    prefill = [w for w, r in enumerate(roles) if r is Role.PREFILL]
    decode = [w for w, r in enumerate(roles) if r is not Role.PREFILL]
    store = open_store(args.dist_host, args.dist_port, is_master=False, timeout_s=args.dist_timeout)
    config = LinkConfig(args.kv_transport, args.transfer_timeout, args.dist_timeout, host=args.dist_host)
    transfers = KVTransfers(
        me,
        sends_to=decode if roles[me] is Role.PREFILL else [],
        receives_from=prefill if roles[me] is not Role.PREFILL else [],
        store=store,
        config=config,
        on_result=lambda result: None,  # replaced once the worker's loop exists
        device=device,
        stall_request=args.fault_stall_recv,
    )
    transfers.connect(build=not args.rejoin)
    return transfers


def register(control: pb_grpc.ControlStub, registration: Registration, timeout: float = 30.0) -> Registered:
    """Register with the scheduler, retrying while it is not reachable yet; the accepted registration."""
    message = codec.to_pb(registration)
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = control.Register(message, timeout=rpc.CALL_TIMEOUT_S, wait_for_ready=True)
            break
        except grpc.RpcError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot register with the scheduler: {rpc.describe(err)}") from None
            time.sleep(0.2)
    answer = codec.registered_from_pb(reply)
    if answer.error is not None:
        raise RuntimeError(f"the scheduler refused registration: {answer.error}")
    return answer


def main() -> int:
    """The worker process of a `WorkerLaunch` read from stdin (`executor.run.launcher` writes it)."""
    try:
        args = read_spec(WorkerLaunch, sys.stdin)
    except ValueError as err:
        print(f"worker: error: {err}", file=sys.stderr, flush=True)
        return 2
    rpc.setup_logging(f"worker-{args.worker_id}", args.log_level)
    torch.set_num_threads(args.threads)
    srv: grpc.Server | None = None
    process: WorkerProcess | None = None

    def on_signal(signum: int, frame: object) -> None:
        if process is not None:
            process.stop(f"signal {signum}")
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    transfers: KVTransfers | None = None
    try:
        device = torch.device(args.device)
        layout = parse_mode(args.mode, args.num_workers or args.worker_id + 1)
        if not 0 <= args.worker_id < layout.num_workers:
            raise ValueError(
                f"worker id {args.worker_id} outside the {layout.num_workers} workers of {args.mode}"
            )
        role = layout.roles[args.worker_id]
        if layout.kind is not Kind.COLOCATED:  # join the KV links first: every worker is starting now
            transfers = connect_links(args, layout.roles, device)
        model = build_model(args.model, args.weights, device, args.seed, quantization=args.quantization)
        pool = PagePool(args.pages)
        budget = args.prefill_budget if role is Role.PREFILL else args.budget
        batcher = Batcher(
            args.worker_id,
            BatchConfig(Policy(args.policy), budget, args.max_decodes),
            pool,
            hand_off=role is Role.PREFILL,
        )
        dtype = kv_dtype(args.kv_cache_dtype, model.dtype)
        cache = PagedKVCache.for_model(pool, model.config, dtype=dtype, device=device)
        runner = build_runner(model, cache, cuda_graphs=args.cuda_graphs)
        if transfers is not None:  # staging for the longest sequence a request may have (4096 + 1024)
            transfers.attach(cache.layers, reserve_pages=min(pool.num_free, pages_for(STAGED_TOKENS)))
        engine = Engine(args.worker_id, model, batcher, runner, transfers=transfers)
        control = pb_grpc.ControlStub(rpc.channel(args.scheduler, args.secret))
        process = WorkerProcess(args.worker_id, engine, control)
        if transfers is not None:
            transfers.set_on_result(process.on_transfer)
        guard = auth.Guard(auth.internal_rules("Worker", args.secret), f"worker {args.worker_id}")
        srv = rpc.server(threads=4, interceptors=(guard,))
        pb_grpc.add_WorkerServicer_to_server(WorkerServicer(process), srv)
        health = rpc.add_health(srv)
        address = rpc.bind(srv, args.host, args.port)
        srv.start()
        config = model.config
        process.sender.incarnation = register(
            control,
            Registration(
                worker_id=args.worker_id,
                address=address,
                pages=pool.num_free,  # what requests can use: CUDA graphs keep a few padding pages
                vocab=config.shape.vocab,
                mask_id=config.mask_id,
                eos_ids=tuple(config.eos_ids),
                model=args.model if args.weights == "random" else str(args.weights),
                device=described(device),
                pid=os.getpid(),
                role=role.value,
                context_len=args.max_model_len or config.context_len,
            ),
        ).incarnation
        rpc.set_serving(health, True)

        def on_hang(why: str) -> None:  # the scheduler's health checks then declare this worker lost
            print(f"worker {args.worker_id}: error: {why}", file=sys.stderr, flush=True)
            rpc.set_serving(health, False)

        watch_for_hangs(lambda: process.step_started, args.hang_timeout, on_hang, process.stopping)
        if args.exit_with_parent:
            rpc.exit_with_parent(lambda: process.stop("the launcher is gone") if process else None)
        process.run()
        rpc.set_serving(health, False)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # the traceback, then one line: the launcher reports the last line
        traceback.print_exc()
        print(f"worker {args.worker_id}: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if srv is not None:
            srv.stop(grace=0.5).wait(2.0)
        if transfers is not None:
            transfers.close()
        if process is not None:
            pool = process.engine.batcher.pool
            print(
                f"worker {args.worker_id}: {pool.num_free} KV pages free at exit", file=sys.stderr, flush=True
            )
    if process is not None and process.failure:
        print(f"worker {args.worker_id}: error: {process.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
