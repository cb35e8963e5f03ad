"""The central scheduler process: the same `sangam.router.Router` as the simulator, driven by live events.

    python -m executor.control.scheduler_service < spec.json   # a process_specs.SchedulerLaunch on stdin

The decisions live in `executor.control.scheduler_state.SchedulerState` (and the KV transfers' state
machine in `executor.control.scheduler_transfers`); this module gives them threads and gRPC. All state
changes happen on one core thread that drains an event queue: arrivals (Submit), worker report batches,
lost workers. gRPC handler
threads validate, post events and read published snapshots; they never touch the router or a `Request`.
Work for a worker (blocks to prefill, KV transfer orders) goes out through `Enqueue` calls made by one
sender thread per worker, so the core thread never waits on the network.

Two servers: the client port (`Scheduler` service and grpc.health.v1, SERVING once every worker has
registered) and the control port (`Control`: registration and reports), so that parked client streams
cannot starve worker traffic. A worker is lost when the launcher reports its process's exit
(`WorkerExited`), when it fails two health checks in a row (a watchdog checks each second), when an
`Enqueue` to it fails, or when it holds work and has not reported for `worker_timeout` seconds; the
router then recovers its requests (`SchedulerState.on_worker_lost`) and the run goes on. Its reports are
refused from then on (FAILED_PRECONDITION: the worker stops) until a new process registers for it. Only
a layout left unable to serve, with no restart coming, fails the cluster: every unfinished request gets
status ERROR with the reason and further submits are refused.

Calls are checked by `executor.control.auth`: the control port and the workers need the run's secret,
the client port the api key when one is set (and its Shutdown the secret or the key). The client port
bounds its open streams (`rpc.StreamLimit`) below its thread count, so Submit, Status and health always
find a thread. A client that follows many requests (`sangam serve`) opens one Watch stream for all of them
instead of one Stream each, and submits them on it (a thread per Watch reads those Submits; their answers
go back on the stream): the core thread hands the states of requests submitted with `watch` to every
open Watch, whose thread sends whatever queued up meanwhile as one message.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from executor.control import auth, codec, rpc
from executor.control.iteration_log import IterationLog
from executor.control.messages import (
    BlockWork,
    ClusterStatus,
    DropOrder,
    Registration,
    ReportBatch,
    RequestState,
    Submission,
    Submitted,
    TransferOrder,
    WatchBatch,
    WorkBatch,
    WorkerExit,
)  # fmt: skip
from executor.control.process_specs import SchedulerLaunch, read_spec
from executor.control.retry import deliver
from executor.control.scheduler_state import TRANSFER_ATTEMPTS, SchedulerState
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc
from sangam.budget import Policy

ENQUEUE_ATTEMPTS = 3
ENQUEUE_BACKOFF_S = 0.1
HEALTH_INTERVAL_S = 1.0
HEALTH_FAILURES = 2  # consecutive failed checks that declare a worker lost
SILENCE_INTERVAL_S = 0.5
WORKER_TIMEOUT_S = 30.0  # a worker holding work that has not reported for this long is lost
CLIENT_THREADS = 256  # a parked Stream holds one
CLIENT_STREAMS = 192  # open Streams at most: CLIENT_THREADS - CLIENT_STREAMS threads stay for unary calls
CLIENT_STREAMS_PER_PEER = 128  # from one client connection
WATCH_CHECK_S = 1.0  # how often an idle Watch stream checks that its client is still there
# updates a Watch stream may fall behind its client before it is cut off (a client that stopped reading
# is not buffered for without end); serve reads its Watch as the updates come, far below this
WATCH_BACKLOG = 16384


class WatchCut(Exception):
    """A Watch stream fell `WATCH_BACKLOG` updates behind: its client stopped reading."""


class _Cut:
    """On a cut watcher's queue: what it held was dropped; the stream ends with `WatchCut`."""


Update = RequestState | Submitted | _Cut | None
CLIENT_MAX_RPCS = 1024  # beyond this, calls fail fast with RESOURCE_EXHAUSTED instead of queueing

log = logging.getLogger("sangam.scheduler")


Work = BlockWork | TransferOrder | DropOrder


class WorkerLink:
    """The scheduler's channel to one process of a worker and the thread that carries work to it."""

    def __init__(self, worker_id: int, address: str, secret: str, incarnation: int = 0) -> None:
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.channel = rpc.channel(address, secret)
        self.stub = pb_grpc.WorkerStub(self.channel)
        self.outbox: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._next: Work | None = None  # a drop that must open the next batch
        self.stopped = False  # told to stop (its worker was lost): the sender thread ends

    def next_batch(self) -> WorkBatch | None:
        """Whatever queued up since the last call (waiting for the first); None once told to stop. The
        worker takes a call's drops, then its blocks, then its orders: the order among orders is kept,
        and a drop issued after a block or an order waits for the next call (it may be about them)."""
        first, self._next = self._next or self.outbox.get(), None
        if first is None:
            return None
        batch = [first]
        while True:
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return None
            if isinstance(item, DropOrder) and not all(isinstance(b, DropOrder) for b in batch):
                self._next = item
                break
            batch.append(item)
        return WorkBatch(
            tuple(b for b in batch if isinstance(b, BlockWork)),
            tuple(t for t in batch if isinstance(t, TransferOrder)),
            tuple(d for d in batch if isinstance(d, DropOrder)),
        )


class SchedulerCore:
    """A `SchedulerState`, the single thread that changes it, and the threads around the workers."""

    def __init__(
        self,
        workers: int,
        *,
        mask_len: int,
        theta: int = 8192,
        policy: Policy = Policy.DEFICIT,
        seed: int = 0,
        stop_at_eos: bool = False,
        iteration_log: Path | None = None,
        mode: str = "colocated",
        transfer_attempts: int = TRANSFER_ATTEMPTS,
        restarts: bool = False,
        worker_timeout: float = WORKER_TIMEOUT_S,
        secret: str,
        watch_backlog: int = WATCH_BACKLOG,
    ) -> None:
        self.secret = secret  # presented on every call to a worker
        self.watch_backlog = watch_backlog
        self.links: dict[int, WorkerLink] = {}
        self.worker_timeout = worker_timeout
        self.state = SchedulerState(
            workers,
            send=self._send,
            clock=time.monotonic,
            mask_len=mask_len,
            theta=theta,
            policy=policy,
            seed=seed,
            stop_at_eos=stop_at_eos,
            mode=mode,
            transfer_attempts=transfer_attempts,
            restarts=restarts,
        )
        self.state.iteration_log = IterationLog(iteration_log) if iteration_log is not None else None
        self.stopped = threading.Event()
        # every worker registered and linked: requests are accepted (the state is complete a moment earlier,
        # before the last link exists, and a request placed then would have no link to go out on)
        self.linked = threading.Event()
        self.on_ready: Callable[[], None] = lambda: None
        self.on_failure: Callable[[], None] = lambda: None
        self._links_lock = threading.Lock()
        self._events: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        # replaced, never changed
        self._watchers: tuple[queue.SimpleQueue[Update], ...] = ()
        self._watchers_lock = threading.Lock()
        self.state.watch = self._to_watchers
        self._core = self._thread(self._core_loop, "core")

    # ---- lifecycle -------------------------------------------------------------------------------------

    def _thread(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def stop(self) -> None:
        """Stop the workers (best effort), the threads, and close the iteration log."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        with self._links_lock:
            links = [link for wid, link in self.links.items() if not self.state.workers[wid].lost]
        for link in links:  # a lost worker's process may not answer; the launcher ends it
            link.outbox.put(None)
            with suppress(grpc.RpcError):
                link.stub.Shutdown(pb.ShutdownRequest(), timeout=2.0)
        self._events.put(None)
        for tracked in list(self.state.tracked.values()):  # wake every parked stream
            tracked.changed.set()
        for watcher in self._watchers:
            watcher.put(None)
        rpc.join_all(self._threads, timeout=3.0)
        if self.state.iteration_log is not None:
            self.state.iteration_log.close()
            self.state.iteration_log = None

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        self._events.put((fn, args))

    def _core_loop(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            fn, args = event
            try:
                fn(*args)
            except Exception as err:  # a bug: fail loudly, never swallow
                log.exception("core event %s failed", getattr(fn, "__name__", fn))
                self._fail(f"internal error in the scheduler: {type(err).__name__}: {err}")

    # ---- gRPC threads ----------------------------------------------------------------------------------

    def register(self, msg: pb.RegisterRequest) -> pb.RegisterReply:
        reg = codec.from_pb(msg, Registration)
        with self._links_lock:
            answer = self.state.register(reg)
            old = self.links.get(reg.worker_id)
            if answer.error is not None or (old is not None and old.incarnation == answer.incarnation):
                return codec.register_reply(answer)
            link = WorkerLink(reg.worker_id, reg.address, self.secret, answer.incarnation)
            self.links[reg.worker_id] = link
            self._thread(self._send_loop, f"enqueue-{reg.worker_id}", link)
            complete = self.state.complete
            if complete:
                self.linked.set()
        if old is not None:  # a new process of a lost worker
            self._post(self.state.on_worker_joined, reg.worker_id)
        elif complete:
            self._thread(self._watchdog, "watchdog")
            self._thread(self._silence_watch, "silence-watch")
            self.on_ready()
        return codec.register_reply(answer)

    def status(self) -> ClusterStatus:
        """The cluster's status; ready only once every worker is linked as well as registered."""
        status = self.state.status()
        return status if self.linked.is_set() else replace(status, ready=False)

    def unavailable(self) -> str | None:
        if self.state.failure:
            return f"the cluster has failed: {self.state.failure}"
        if self.stopped.is_set():
            return "the scheduler is shutting down"
        if not self.linked.is_set():
            expected, registered = self.state.layout.num_workers, len(self.state.workers)
            linking = ", linking" if registered == expected else ""
            return f"waiting for workers: {registered} of {expected} registered{linking}"
        return None

    def submit(self, sub: Submission) -> RequestState:
        """Accept one request (or record why not): its first state; the caller checked `unavailable()`
        first."""
        tracked = self.state.submit(sub)
        if tracked.req is not None:
            self._post(self.state.on_arrival, tracked)
        return tracked.state

    def report(self, msg: pb.ReportBatch) -> str | None:
        """Queue a worker's report batch; why it is refused (a lost or unknown sender), or None."""
        batch = codec.from_pb(msg, ReportBatch)
        reason = self.state.refusal(batch)
        if reason is not None:
            log.warning("report refused: %s", reason)
            return reason
        self._post(self.state.on_batch, batch)
        return None

    def worker_exited(self, msg: pb.WorkerExit) -> None:
        """The launcher saw a worker process exit: that process's worker is lost (a later one stays). A
        final exit (the launcher gave the worker up) counts for a lost worker whatever its pid: a process
        that died at start never registered."""
        exit = codec.from_pb(msg, WorkerExit)
        with self._links_lock:
            info = self.state.workers.get(exit.worker_id)
            if info is None or (info.registration.pid != exit.pid and not (exit.final and info.lost)):
                return
            incarnation = info.incarnation
        self.worker_lost(exit.worker_id, incarnation, f"its process {exit.reason}", exit.final)

    def stream(self, rid: int, active: Callable[[], bool]) -> Iterator[RequestState]:
        tracked = self.state.tracked.get(rid)
        if tracked is None:
            yield self.state.poll(rid)
            return
        last: RequestState | None = None
        while True:
            changed = tracked.changed  # read before the state: a publish in between sets this event
            state = tracked.state
            if state is not last:
                yield state
                last = state
            if state.status.terminal or self.stopped.is_set() or not active():
                return
            changed.wait(1.0)

    def watch(
        self, submits: Iterator[tuple[int, Submission]], active: Callable[[], bool]
    ) -> Iterator[WatchBatch]:
        """The states of watched requests published from now on, in batches: what queued up since the last
        batch, the latest state of each request (a state holds all that came before it), and the answers
        to the `submits` (tag, submission) read from the stream meanwhile (each submitted with `watch`).
        An empty batch first, once registered; the last once the scheduler stops or `submits` ends. A
        stream whose client fell `watch_backlog` updates behind (it stopped reading) is cut: what it held
        is dropped, and it raises `WatchCut` where it stands."""
        updates: queue.SimpleQueue[Update] = queue.SimpleQueue()
        with self._watchers_lock:
            self._watchers = (*self._watchers, updates)

        def read() -> None:
            """Until the client stops sending, which ends the stream."""
            try:
                with suppress(grpc.RpcError):  # cancelled
                    for tag, sub in submits:
                        reason = self.unavailable()
                        answer = self.submit(replace(sub, watch=True)) if reason is None else None
                        updates.put(Submitted(tag, answer, reason or ""))
            finally:
                updates.put(None)

        threading.Thread(target=read, name="watch-submits", daemon=True).start()
        try:
            yield WatchBatch([], [])
            while not self.stopped.is_set() and active():
                try:
                    item = updates.get(timeout=WATCH_CHECK_S)
                except queue.Empty:
                    continue
                states: dict[int, RequestState] = {}
                submitted: list[Submitted] = []
                while item is not None:
                    if isinstance(item, _Cut):
                        raise WatchCut(
                            f"the Watch stream fell {self.watch_backlog} updates behind its client: cut off"
                        )
                    if isinstance(item, Submitted):
                        submitted.append(item)
                    else:
                        states[item.request_id] = item
                    try:
                        item = updates.get_nowait()
                    except queue.Empty:
                        break
                if states or submitted:
                    yield WatchBatch(list(states.values()), submitted)
                if item is None:  # the scheduler is stopping, or the client has stopped sending
                    return
        finally:
            with self._watchers_lock:
                self._watchers = tuple(w for w in self._watchers if w is not updates)

    def _to_watchers(self, state: RequestState) -> None:
        behind = []
        for watcher in self._watchers:
            if watcher.qsize() < self.watch_backlog:
                watcher.put(state)
            else:
                behind.append(watcher)
        if behind:
            with self._watchers_lock:
                self._watchers = tuple(w for w in self._watchers if all(w is not b for b in behind))
            for watcher in behind:
                with suppress(queue.Empty):
                    while True:
                        watcher.get_nowait()
                watcher.put(_Cut())
            log.warning(
                "cut off %d Watch stream(s) %d updates behind their client", len(behind), self.watch_backlog
            )

    def cancel(self, rid: int) -> RequestState:
        """Cancel request `rid` on the core thread; its state once that is done."""
        done = threading.Event()

        def cancel() -> None:
            try:
                self.state.cancel(rid)
            finally:
                done.set()

        self._post(cancel)
        done.wait(rpc.CALL_TIMEOUT_S / 2)
        return self.state.poll(rid)

    def worker_lost(self, worker: int, incarnation: int, reason: str, final: bool = False) -> None:
        """Process `incarnation` of `worker` is gone (from any thread); `final`: no new one will follow."""
        self._post(self._lose, worker, incarnation, reason, final)

    # ---- core thread -----------------------------------------------------------------------------------

    def _lose(self, worker: int, incarnation: int | None, reason: str, final: bool = False) -> None:
        self.state.on_worker_lost(worker, reason, incarnation, final)
        self._stop_lost_links()
        if self.state.failure:
            self.on_failure()

    def _stop_lost_links(self) -> None:
        """Nothing more goes to a lost worker's process (the router recalled what it held)."""
        with self._links_lock:
            for wid, link in self.links.items():
                if self.state.workers[wid].lost and not link.stopped:
                    link.stopped = True
                    link.outbox.put(None)

    def _lose_silent(self) -> None:
        self.state.lose_silent(self.worker_timeout)
        self._stop_lost_links()
        if self.state.failure:
            self.on_failure()

    def _fail(self, reason: str) -> None:
        if self.state.fail(reason):
            self.on_failure()

    def _send(self, worker: int, item: Work) -> None:
        self.links[worker].outbox.put(item)

    # ---- per-worker threads ----------------------------------------------------------------------------

    def _send_loop(self, link: WorkerLink) -> None:
        """Carry blocks and transfer orders to one worker, batching whatever queued up meanwhile."""
        with suppress(grpc.FutureTimeoutError):  # connect now, not on the first dispatch
            grpc.channel_ready_future(link.channel).result(timeout=rpc.CALL_TIMEOUT_S)
        while (batch := link.next_batch()) is not None:
            message = codec.to_pb(batch)
            try:
                delivered = deliver(
                    partial(link.stub.Enqueue, message, timeout=rpc.CALL_TIMEOUT_S),
                    attempts=ENQUEUE_ATTEMPTS,
                    backoff_s=ENQUEUE_BACKOFF_S,
                    stopping=self.stopped,
                    permanent=lambda err: err.code() is grpc.StatusCode.INVALID_ARGUMENT,
                )
            except grpc.RpcError as err:
                self.worker_lost(link.worker_id, link.incarnation, f"Enqueue failed: {rpc.describe(err)}")
                return
            if not delivered:
                return

    def _silence_watch(self) -> None:
        """Twice a second: workers holding work that have not reported for `worker_timeout` are lost (on
        its own thread: a health check of a stopped worker takes its whole deadline)."""
        while not self.stopped.wait(SILENCE_INTERVAL_S) and not self.state.failure:
            self._post(self._lose_silent)

    def _watchdog(self) -> None:
        """Each second: the health of every current worker process."""
        failures: dict[WorkerLink, int] = {}
        while not self.stopped.wait(HEALTH_INTERVAL_S):
            if self.state.failure:
                return
            with self._links_lock:
                links = [link for wid, link in self.links.items() if not self.state.workers[wid].lost]
            for link in links:
                reason = rpc.check_health(link.channel)
                failures[link] = 0 if reason is None else failures.get(link, 0) + 1
                if reason is not None and failures[link] == HEALTH_FAILURES:
                    self.worker_lost(link.worker_id, link.incarnation, f"health check failed: {reason}")


class SchedulerServicer(pb_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore, shutdown: Callable[[], None]) -> None:
        self.core = core
        self.shutdown = shutdown

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitReply:
        reason = self.core.unavailable()
        if reason is not None:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        return codec.submit_reply(self.core.submit(codec.from_pb(request, Submission)))

    def Poll(self, request: pb.RequestRef, context: grpc.ServicerContext) -> pb.RequestState:
        return codec.to_pb(self.core.state.poll(request.request_id))

    def Stream(self, request: pb.RequestRef, context: grpc.ServicerContext) -> Iterator[pb.RequestState]:
        for state in self.core.stream(request.request_id, context.is_active):
            yield codec.to_pb(state)

    def Watch(
        self, requests: Iterator[pb.WatchRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StateBatch]:
        submits = ((m.tag, codec.from_pb(m.submit, Submission)) for m in requests if m.HasField("submit"))
        try:
            for batch in self.core.watch(submits, context.is_active):
                yield codec.to_pb(batch)
        except WatchCut as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))

    def Cancel(self, request: pb.RequestRef, context: grpc.ServicerContext) -> pb.RequestState:
        return codec.to_pb(self.core.cancel(request.request_id))

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return codec.to_pb(self.core.status())

    def Results(self, request: pb.ResultsRequest, context: grpc.ServicerContext) -> pb.ResultsReply:
        records = self.core.state.records[request.first :]  # appended to only: a slice is a snapshot
        return pb.ResultsReply(requests=[codec.record_of(req) for req in records])

    def Shutdown(self, request: pb.ShutdownRequest, context: grpc.ServicerContext) -> pb.ShutdownReply:
        threading.Thread(target=self.shutdown, name="shutdown", daemon=True).start()
        return pb.ShutdownReply()


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        return self.core.register(request)

    def Report(self, request: pb.ReportBatch, context: grpc.ServicerContext) -> pb.ReportReply:
        reason = self.core.report(request)
        if reason is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"reports refused: {reason}; stop")
        return pb.ReportReply()

    def WorkerExited(self, request: pb.WorkerExit, context: grpc.ServicerContext) -> pb.ReportReply:
        self.core.worker_exited(request)
        return pb.ReportReply()


class SchedulerServer:
    """The scheduler's two gRPC servers around one `SchedulerCore`; `api_key` (None: an open client port)
    and the core's secret guard them."""

    def __init__(
        self,
        core: SchedulerCore,
        host: str = "127.0.0.1",
        port: int = 0,
        control_port: int = 0,
        *,
        api_key: str | None = None,
    ) -> None:
        self.core = core
        client_guard = auth.Guard(auth.client_port_rules(api_key, core.secret), "scheduler client port")
        streams = rpc.StreamLimit(CLIENT_STREAMS, CLIENT_STREAMS_PER_PEER)
        self.client_server = rpc.server(CLIENT_THREADS, CLIENT_MAX_RPCS, (client_guard, streams))
        control_guard = auth.Guard(auth.internal_rules("Control", core.secret), "scheduler control port")
        self.control_server = rpc.server(8, interceptors=(control_guard,))
        pb_grpc.add_SchedulerServicer_to_server(SchedulerServicer(core, self.stop), self.client_server)
        pb_grpc.add_ControlServicer_to_server(ControlServicer(core), self.control_server)
        self.health = rpc.add_health(self.client_server)
        self.address = rpc.bind(self.client_server, host, port)
        self.control_address = rpc.bind(self.control_server, "127.0.0.1", control_port)
        core.on_ready = lambda: rpc.set_serving(self.health, True)
        core.on_failure = lambda: rpc.set_serving(self.health, False)
        self._stop_lock = threading.Lock()

    def start(self) -> None:
        self.control_server.start()
        self.client_server.start()

    def stop(self) -> None:
        with self._stop_lock:
            if self.core.stopped.is_set():
                return
            rpc.set_serving(self.health, False)
            self.core.stop()
            self.client_server.stop(grace=0.5).wait(2.0)
            self.control_server.stop(grace=0.2).wait(2.0)


def main() -> int:
    """The scheduler process of a `SchedulerLaunch` read from stdin (`executor.run.launcher` writes it)."""
    try:
        args = read_spec(SchedulerLaunch, sys.stdin)
    except ValueError as err:
        print(f"scheduler: error: {err}", file=sys.stderr, flush=True)
        return 2
    rpc.setup_logging("scheduler", args.log_level)
    try:
        core = SchedulerCore(
            args.workers,
            mask_len=args.mask_len,
            theta=args.theta,
            policy=Policy(args.policy),
            seed=args.seed,
            stop_at_eos=args.stop_at_eos,
            iteration_log=Path(args.iteration_log) if args.iteration_log else None,
            mode=args.mode,
            transfer_attempts=args.transfer_attempts,
            restarts=args.restart_workers,
            worker_timeout=args.worker_timeout,
            secret=args.secret,
        )
        server = SchedulerServer(core, args.host, args.port, args.control_port, api_key=args.api_key)
    except (ValueError, OSError) as err:
        print(f"scheduler: error: {err}", file=sys.stderr, flush=True)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        threading.Thread(target=server.stop, name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if args.exit_with_parent:
        rpc.exit_with_parent(server.stop)
    info = {"address": server.address, "control": server.control_address, "pid": os.getpid()}
    tmp = Path(args.ready_file).with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(args.ready_file)
    while not core.stopped.wait(0.5):
        pass
    server.stop()  # idempotent: waits for the servers if another thread began the stop
    return 0


if __name__ == "__main__":
    sys.exit(main())
