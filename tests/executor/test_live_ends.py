"""How a live run keeps what finished and says why it ended, without processes: the results collector
against a fake scheduler, and a dead child's exit reason."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from executor.run.launcher import Child
from executor.run.live_collect import Collector


class FakeScheduler:
    """`done` requests finished so far; records are their ids."""

    def __init__(self) -> None:
        self.done = 0
        self.calls: list[tuple[str, int]] = []

    def status(self) -> Any:
        self.calls.append(("status", self.done))
        return SimpleNamespace(done=self.done, first_arrival=5.0)

    def results(self, first: int = 0) -> list[int]:
        self.calls.append(("results", first))
        return list(range(first, self.done))


def test_the_collector_fetches_only_new_records_and_at_most_once_per_interval() -> None:
    scheduler, now = FakeScheduler(), [0.0]
    collector = Collector(scheduler, interval_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    scheduler.done = 2
    collector.poll()
    scheduler.done = 5
    now[0] = 0.5
    collector.poll()  # too soon
    now[0] = 1.0
    collector.poll()
    collector.poll()
    collector.fetch()  # at the end: whatever the interval
    assert collector.records == [0, 1, 2, 3, 4] and collector.origin == 5.0  # type: ignore[comparison-overlap]
    assert scheduler.calls == [
        ("status", 2), ("results", 0), ("status", 5), ("results", 2), ("status", 5),
    ]  # fmt: skip


def test_an_exit_reason_is_the_signal_or_the_error_line_the_child_printed_not_its_logs_last_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text("worker 0: error: the failure\nWARNING a later warning\n")
    proc = subprocess.Popen(["true"])
    proc.wait()
    with log.open("ab") as f:
        child = Child("worker 0", proc, log, f, worker=0)
        assert child.exit_reason(-signal.SIGKILL) == "was killed by SIGKILL"
        assert child.exit_reason(1) == "exited with status 1 (worker 0: error: the failure)"
        log.write_text("INFO started\nWARNING a late warning\n")
        assert child.exit_reason(1) == "exited with status 1"
