"""The scheduler's Watch: the states of watched requests, batched per stream, and only those."""

from __future__ import annotations

from executor.messages import Registration, RequestState, RequestStatus, Submission
from executor.scheduler import SchedulerCore
from executor.scheduler_state import SchedulerState

PROMPT = tuple(range(1, 21))
WORKER = Registration(0, "127.0.0.1:7000", 100, 1000, 999, (2,), "tiny", "cpu", 40, "colocated", 4096)


def test_a_watch_starts_empty_then_sends_what_queued_up_one_latest_state_per_request() -> None:
    core = SchedulerCore(1, mask_len=64, secret="s")
    try:
        first = core.watch(lambda: True)
        assert next(first) == []  # registered: nothing published from now on is missed
        a0, b0 = RequestState(0, RequestStatus.QUEUED), RequestState(1, RequestStatus.QUEUED)
        a1 = RequestState(0, RequestStatus.RUNNING, blocks_done=1)
        for published in (a0, b0, a1):
            core.state.watch(published)
        second = core.watch(lambda: True)
        assert next(second) == []
        b1 = RequestState(1, RequestStatus.DONE, blocks_done=1)
        core.state.watch(b1)
        assert next(first) == [a1, b1]  # each request's latest state, once
        assert next(second) == [b1]  # opened after the others were published
    finally:
        core.stop()
    assert list(first) == [] and list(second) == []  # a stopping scheduler ends them


def test_only_requests_submitted_with_watch_reach_it() -> None:
    seen: list[RequestState] = []
    state = SchedulerState(1, send=lambda worker, item: None, clock=lambda: 1.0, mask_len=64)
    state.watch = seen.append
    state.register(WORKER)
    watched = state.submit(Submission(PROMPT, 32, watch=True))
    state.submit(Submission(PROMPT, 32))  # not watched
    state.submit(Submission((), 32, watch=True))  # refused at Submit: its reply says so
    state.on_arrival(watched)
    assert [(s.request_id, s.status) for s in seen] == [
        (watched.id, RequestStatus.QUEUED),
        (watched.id, RequestStatus.RUNNING),
    ]
