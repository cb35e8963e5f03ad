"""The worker's report sender without a scheduler: heartbeats while idle, and a fenced worker's stop."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from executor.control.messages import IterationReport, IterationStats
from executor.proto import sangam_pb2 as pb
from executor.worker import report_sender
from executor.worker.report_sender import ReportSender


class Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "reports refused: worker 3 (incarnation 0) was declared lost; stop"


class Control:
    def __init__(self, refuse: bool = False) -> None:
        self.batches: list[pb.ReportBatch] = []
        self.refuse = refuse

    def Report(self, message: pb.ReportBatch, timeout: float) -> None:
        self.batches.append(message)
        if self.refuse:
            raise Refused()


def test_an_idle_sender_sends_heartbeats_with_the_free_pages_and_its_incarnation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report_sender, "HEARTBEAT_S", 0.02)
    control, failures = Control(), []
    sender = ReportSender(3, control, lambda: 17, threading.Event(), failures.append)  # type: ignore[arg-type]
    sender.incarnation = 2
    sender.start()
    sender.outbox.put(IterationReport(IterationStats(3, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0), 0.5))
    time.sleep(0.2)
    sender.finish(timeout=2.0)
    first, *beats = control.batches
    assert len(first.iterations) == 1 and len(beats) >= 3 and not failures
    assert all(not b.iterations and b.free_pages == 17 and b.incarnation == 2 for b in beats)
    assert {b.worker_id for b in control.batches} == {3}


def test_a_refused_report_stops_the_sender_and_says_why() -> None:
    control, failures = Control(refuse=True), []
    sender = ReportSender(3, control, lambda: 0, threading.Event(), failures.append)  # type: ignore[arg-type]
    sender.start()
    sender.outbox.put(IterationReport(IterationStats(3, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0), 0.5))
    sender.finish(timeout=2.0)
    assert len(control.batches) == 1  # no retry: permanent
    assert failures == [f"the scheduler refused this worker's reports: {Refused().details()}"]
