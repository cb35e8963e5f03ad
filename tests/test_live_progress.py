"""`sangam live`'s progress: the watcher hears requests finished of the point's, those submitted and the
running mean end-to-end latency, polled at most once a second; a live replay on CPU ends on all done."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_helpers import replay, write_trace

from executor.control.messages import ClusterStatus
from executor.run.live_tally import LiveTally, mean_e2e_s
from runs.tally import Tally
from sangam.request import BlockRecord, Request


def record(arrival: float, end: float | None) -> Request:
    """A request of two blocks, the last ending at `end` (None: still running)."""
    first = BlockRecord(ready=arrival, end=arrival + 0.5)
    return Request(0, arrival, 4, 64, 64, (1, 1), blocks=[first, BlockRecord(ready=arrival + 0.5, end=end)])


class FakeClient:
    def __init__(self) -> None:
        self.done, self.records, self.calls = 0, [record(0.0, 2.0)], {"status": 0, "results": 0}

    def status(self) -> ClusterStatus:
        self.calls["status"] += 1
        return ClusterStatus(
            ready=True, workers_expected=1, workers_registered=1, submitted=5, done=self.done, errors=1,
            iterations=0, failure="", mask_len=64, layout="1C", transfers_done=0, transfers_failed=0,
            transfer_retries=0, transfers_in_flight=0, first_arrival=0.0, workers=(), facts=None,
        )  # fmt: skip

    def results(self) -> list[Request]:
        self.calls["results"] += 1
        return self.records


def test_mean_e2e_is_over_finished_requests_only() -> None:
    assert mean_e2e_s([record(1.0, 4.0), record(2.0, 3.0), record(0.0, None)]) == 2.0
    assert mean_e2e_s([]) is None


def test_the_tally_polls_at_most_once_a_second_and_results_only_when_more_are_done() -> None:
    client, heard = FakeClient(), []
    tally = LiveTally(client, heard.append, total=10, every_s=3600)  # type: ignore[arg-type]
    tally.poll()
    tally.poll()  # too soon: nothing asked
    assert heard == [Tally(1, 10, "5 submitted, mean e2e 2.00 s")] and client.calls == {
        "status": 1,
        "results": 1,
    }
    tally.poll(final=True)  # done unchanged: no new results fetched
    client.done = 4
    tally.poll(final=True)
    assert heard[-1].done == 5 and client.calls == {"status": 3, "results": 2}


def test_a_live_replay_tells_its_watcher_up_to_every_request_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heard: list[Tally] = []

    @contextlib.contextmanager
    def watching(*_: Any) -> Iterator[Any]:
        yield heard.append

    monkeypatch.setattr("cli.bars.bar", watching)
    trace = write_trace(tmp_path / "trace.csv", 12, qps=4.0, prompt=(4, 40), output=(1, 64), seed=1)
    replay(["--workers", "1", "--trace", str(trace), "--mask-len", "64", "--log-dir", str(tmp_path / "logs")])
    assert heard and heard[-1].done == heard[-1].total == 12 and "12 submitted, mean e2e" in heard[-1].note
    assert [t.done for t in heard] == sorted(t.done for t in heard)
