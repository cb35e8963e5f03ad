"""A worker's reports to the scheduler: one thread batches what the loop, the KV link threads and the
gRPC threads put on its outbox (iteration reports, transfer events) into `Control.Report` calls.

Each batch carries the pool's free pages (read when it is sent, after every queued change was made) and
the process's incarnation (its registration's number). After `HEARTBEAT_S` without anything to send it
sends an empty batch: the scheduler declares a worker that holds work and stays silent lost. A report the
scheduler refuses (FAILED_PRECONDITION: this process was declared lost, a newer one may serve) or cannot
take after its retries ends the sender through `on_failure`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from functools import partial

import grpc

from executor.control import codec, rpc
from executor.control.messages import IterationReport, ReportBatch, TransferEvent
from executor.control.retry import deliver
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc

REPORT_BATCH = 256  # iterations per Report call at most
REPORT_ATTEMPTS = 4
REPORT_BACKOFF_S = 0.2
HEARTBEAT_S = 1.0

Outbound = IterationReport | TransferEvent


class ReportSender:
    """The outbox of one worker process and the thread that empties it; `None` on the outbox ends it
    after what was queued before."""

    def __init__(
        self,
        worker_id: int,
        control: pb_grpc.ControlStub,
        free_pages: Callable[[], int],
        stopping: threading.Event,
        on_failure: Callable[[str], None],
    ) -> None:
        self.worker_id = worker_id
        self.control = control
        self.free_pages = free_pages
        self.stopping = stopping
        self.on_failure = on_failure
        self.incarnation = 0  # the scheduler's number of this process's registration
        self.outbox: queue.SimpleQueue[Outbound | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="report-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float) -> None:
        """Send what is queued, then end (waiting up to `timeout` seconds)."""
        self.outbox.put(None)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            try:
                first = self.outbox.get(timeout=HEARTBEAT_S)
            except queue.Empty:  # a heartbeat: the scheduler sees this worker alive although idle
                if not self._send(self._batch([])):
                    return
                continue
            if first is None:
                return
            batch, last = [first], False
            while len(batch) < REPORT_BATCH:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    last = True
                    break
                batch.append(item)
            if not self._send(self._batch(batch)) or last:
                return

    def _batch(self, items: Sequence[Outbound]) -> ReportBatch:
        return ReportBatch(
            self.worker_id,
            iterations=tuple(r for r in items if isinstance(r, IterationReport)),
            transfers=tuple(e for e in items if isinstance(e, TransferEvent)),
            free_pages=self.free_pages(),
            incarnation=self.incarnation,
        )

    def _send(self, batch: ReportBatch) -> bool:
        message: pb.ReportBatch = codec.to_pb(batch)
        try:
            return deliver(
                partial(self.control.Report, message, timeout=rpc.CALL_TIMEOUT_S),
                attempts=REPORT_ATTEMPTS,
                backoff_s=REPORT_BACKOFF_S,
                stopping=self.stopping,
                permanent=lambda err: err.code() is grpc.StatusCode.FAILED_PRECONDITION,
            )
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.FAILED_PRECONDITION:  # fenced: a newer process may serve
                self.on_failure(f"the scheduler refused this worker's reports: {err.details()}")
            else:
                self.on_failure(f"cannot report to the scheduler: {rpc.describe(err)}")
            return False
