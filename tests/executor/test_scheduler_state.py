"""The scheduler's state without gRPC or threads: registrations, submissions and the workers' reports in,
the work it sends and the states clients read out."""

from __future__ import annotations

import itertools
from dataclasses import replace

from executor.messages import (
    BlockDone,
    BlockWork,
    IterationReport,
    IterationStats,
    Prefilled,
    Registration,
    ReportBatch,
    RequestStatus,
    Submission,
    TransferEvent,
    TransferKind,
    TransferOrder,
)
from executor.scheduler_state import SchedulerState

PAGES = 100
PROMPT = tuple(range(1, 21))  # with a 64-token mask buffer: 6 pages


def registration(worker: int, role: str = "colocated", vocab: int = 1000) -> Registration:
    return Registration(
        worker, f"127.0.0.1:{7000 + worker}", PAGES, vocab, 999, (2,), "tiny", "cpu", 40 + worker, role
    )


def state(mode: str, workers: int, attempts: int = 3) -> tuple[SchedulerState, list[tuple[int, object]]]:
    sent: list[tuple[int, object]] = []
    ticks = itertools.count(100)
    core = SchedulerState(
        workers,
        send=lambda worker, item: sent.append((worker, item)),
        clock=lambda: float(next(ticks)),
        mask_len=64,
        mode=mode,
        transfer_attempts=attempts,
    )
    return core, sent


def stats(worker: int) -> IterationStats:
    return IterationStats(worker, 1.0, 2.0, 0, 0, 1, 84, 0, 0, 1024.0, 0, 0)


def test_registration_checks_the_layouts_role_and_the_model_and_accepts_the_same_process_again() -> None:
    core, _ = state("1P1D", 2)
    assert core.register(registration(2)) == "worker id 2 outside 0..1"
    assert core.register(registration(0)) == "worker 0 has the colocated role, 1P1D gives it the prefill role"
    assert core.register(registration(0, "prefill")) is None
    assert core.register(registration(0, "prefill")) is None  # the same process, again
    elsewhere = replace(registration(0, "prefill"), address="127.0.0.1:1")
    assert core.register(elsewhere) == "worker 0 is already registered"
    assert (
        core.register(registration(1, "decode", vocab=5)) == "worker 1 serves a different model than worker 0"
    )
    assert not core.complete
    assert core.register(registration(1, "decode")) is None
    assert core.complete and core.facts is not None and core.facts.pages == PAGES


def test_a_bad_submission_is_an_error_state_and_never_reaches_the_router() -> None:
    core, sent = state("colocated", 1)
    core.register(registration(0))
    tracked = core.submit(Submission(PROMPT, gen_len=48))
    assert tracked.req is None and tracked.state.status is RequestStatus.ERROR
    assert tracked.state.error == "gen length 48 is not a positive multiple of 32"
    assert (core.submitted, core.errors, core.first_arrival, sent) == (1, 1, None, [])
    assert core.poll(5).status is RequestStatus.NOT_FOUND


def test_a_colocated_request_runs_block_by_block_and_ends_done_with_its_record() -> None:
    core, sent = state("colocated", 1)
    core.register(registration(0))
    tracked = core.submit(Submission(PROMPT, gen_len=64, forwards=(3, 4)))
    core.on_arrival(tracked)
    assert sent == [(0, BlockWork(0, 100.0, 0, 20, 64, PROMPT, 3))]
    assert tracked.state.status is RequestStatus.RUNNING
    first = tuple(range(100, 132))
    report = IterationReport(
        stats(0),
        0.1,
        prefilled=(Prefilled(0, 0, 101.0, 102.0),),
        finished=(BlockDone(0, 0, first, 3, 103.0),),
    )
    core.on_batch(ReportBatch(0, (report,)))
    assert sent[1] == (0, BlockWork(0, 100.0, 1, 20, 64, PROMPT + first, 4))  # the re-prefill, anywhere
    assert tracked.state.token_ids == first and tracked.state.blocks_done == 1
    second = tuple(range(200, 232))
    report = IterationReport(
        stats(0),
        0.1,
        prefilled=(Prefilled(0, 1, 104.0, 105.0),),
        finished=(BlockDone(0, 1, second, 4, 106.0),),
    )
    core.on_batch(ReportBatch(0, (report,), free_pages=PAGES))
    assert tracked.state.status is RequestStatus.DONE and tracked.state.end == 106.0
    assert tracked.state.token_ids == first + second and tracked.state.forwards == (3, 4)
    assert [r.id for r in core.records] == [0] and core.done == 1


def test_a_transfer_given_up_fails_the_request_and_gives_both_ends_pages_back_to_the_tally() -> None:
    core, sent = state("1P1D", 2, attempts=1)
    core.register(registration(0, "prefill"))
    core.register(registration(1, "decode"))
    tracked = core.submit(Submission(PROMPT, gen_len=64, forwards=(3, 4)))
    core.on_arrival(tracked)
    ids = tuple(range(100, 132))
    handoff = Prefilled(0, 0, 101.0, 102.0, handoff=True, block_tokens=ids)
    core.on_batch(ReportBatch(0, (IterationReport(stats(0), 0.1, prefilled=(handoff,)),)))
    receive, send = (item for _, item in sent[1:])
    assert [w for w, _ in sent] == [0, 1, 0]
    assert isinstance(receive, TransferOrder) and receive.kind is TransferKind.RECEIVE
    assert receive.block_tokens == ids and receive.work == BlockWork(0, 100.0, 0, 20, 64, PROMPT, 3)
    assert isinstance(send, TransferOrder) and send.kind is TransferKind.SEND and send.tag == receive.tag
    assert core.router is not None and core.router.free == [PAGES - 6, PAGES - 6]

    failed = TransferEvent(TransferKind.RECEIVE, 0, 1, False, "timed out", 103.0, 104.0)
    core.on_batch(ReportBatch(1, transfers=(failed,)))
    core.on_batch(
        ReportBatch(0, transfers=(TransferEvent(TransferKind.SEND, 0, 1, False, "reset", 103.0, 104.0),))
    )
    release = sent[3]
    assert release == (0, TransferOrder(TransferKind.RELEASE, 0, 1, 0, 0, peer=1, pages=6))
    assert tracked.state.status is RequestStatus.ERROR
    assert tracked.state.error == (
        "KV transfer of block 0 from worker 0 to worker 1 failed after 1 attempts: timed out"
    )
    assert core.router.free == [PAGES - 6, PAGES]  # the destination freed its pages on its failure
    core.on_batch(ReportBatch(0, transfers=(TransferEvent(TransferKind.RELEASE, 0, 1, True),)))
    assert core.router.free == [PAGES, PAGES]
    status = core.status()
    assert (status.transfers_failed, status.transfers_in_flight, status.errors) == (1, 0, 1)
