"""executor/control/scheduler_service.py: the scheduler core accepts requests only once every worker it
waits for is registered and has a link to carry work to it."""

from __future__ import annotations

import pytest

from executor.control import codec, scheduler_service
from executor.control.messages import Registration
from executor.control.scheduler_service import SchedulerCore


def registration(worker: int) -> Registration:
    return Registration(
        worker, f"127.0.0.1:{7000 + worker}", 64, 1000, 999, (2,), "tiny", "cpu", 40, "colocated", 4096
    )


def test_requests_wait_for_the_last_workers_link_not_only_its_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the last registration completes the state (its router exists) a moment before its link: a request
    # accepted in that moment was placed on a worker with no link (KeyError in the core, seen under load)
    seen: list[tuple[str | None, bool]] = []

    class WatchedLink(scheduler_service.WorkerLink):
        def __init__(self, *args: object, **kwargs: object) -> None:
            seen.append((core.unavailable(), core.status().ready))
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scheduler_service, "WorkerLink", WatchedLink)
    core = SchedulerCore(2, mask_len=64, secret="test")
    try:
        for worker in (0, 1):
            reply = core.register(codec.to_pb(registration(worker)))
            assert not reply.error, reply.error
        assert core.state.complete and len(seen) == 2
        # neither a submit nor a client polling Status (the launcher's and the client's wait) gets in
        assert all(u is not None and u.startswith("waiting for workers") and not r for u, r in seen), seen
        assert core.unavailable() is None and core.status().ready
    finally:
        core.stop()
