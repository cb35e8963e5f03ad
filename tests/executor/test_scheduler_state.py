"""The scheduler's state without gRPC or threads: registrations, submissions and the workers' reports in,
the work it sends and the states clients read out."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from executor.control.messages import (
    BlockDone,
    BlockWork,
    DropOrder,
    IterationReport,
    IterationStats,
    Logprobs,
    Prefilled,
    Registered,
    Registration,
    ReportBatch,
    RequestStatus,
    Sampling,
    Submission,
    TransferEvent,
    TransferKind,
    TransferOrder,
    WorkBatch,
)
from executor.control.scheduler_state import SchedulerState
from runs.results import RecoveryCounts
from sangam.hardware import pages_for

PAGES = 100
PROMPT = tuple(range(1, 21))  # with a 64-token mask buffer: 6 pages


def registration(worker: int, role: str = "colocated", vocab: int = 1000) -> Registration:
    return Registration(
        worker, f"127.0.0.1:{7000 + worker}", PAGES, vocab, 999, (2,), "tiny", "cpu", 40 + worker, role, 4096
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
    assert core.register(registration(2)).error == "worker id 2 outside 0..1"
    assert (
        core.register(registration(0)).error
        == "worker 0 has the colocated role, 1P1D gives it the prefill role"
    )
    assert core.register(registration(0, "prefill")).error is None
    assert core.register(registration(0, "prefill")).error is None  # the same process, again
    elsewhere = replace(registration(0, "prefill"), address="127.0.0.1:1")
    assert core.register(elsewhere).error == "worker 0 is already registered"
    assert (
        core.register(registration(1, "decode", vocab=5)).error
        == "worker 1 serves a different model than worker 0"
    )
    assert not core.complete
    assert core.register(registration(1, "decode")).error is None
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


def test_a_request_asking_for_logprobs_gets_every_blocks_in_order_and_others_none() -> None:
    core, sent = state("colocated", 1)
    core.register(registration(0))
    asking = core.submit(Submission(PROMPT, gen_len=64, sampling=Sampling(logprobs=1), forwards=(3, 4)))
    other = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,)))
    core.on_arrival(asking)
    core.on_arrival(other)
    assert [work.sampling.logprobs for _, work in sent] == [1, None]  # type: ignore[attr-defined]
    assert asking.state.logprobs == Logprobs(top=1) and other.state.logprobs is None

    def scores(block: int) -> Logprobs:
        return Logprobs(tuple(-(block + i / 100) for i in range(32)), 1, tuple(range(32)), (-0.5,) * 32)

    for block in (0, 1):
        ids = tuple(range(100 * block, 100 * block + 32))
        prefilled = tuple(Prefilled(rid, block, 101.0, 102.0) for rid in (0, 1)[: 2 - block])
        finished = tuple(
            BlockDone(rid, block, ids, 3, 103.0, logprobs=scores(block) if rid == 0 else None)
            for rid in (0, 1)[: 2 - block]
        )
        core.on_batch(
            ReportBatch(0, (IterationReport(stats(0), 0.1, prefilled=prefilled, finished=finished),))
        )
    assert asking.state.status is RequestStatus.DONE and asking.state.logprobs == scores(0) + scores(1)
    assert len(asking.state.logprobs.token) == len(asking.state.token_ids) == 64
    assert other.state.status is RequestStatus.DONE and other.state.logprobs is None
    refused = core.submit(Submission(PROMPT, gen_len=32, sampling=Sampling(logprobs=21))).state
    assert refused.error == "log-prob alternatives must lie in [0, 20], got 21" and refused.logprobs is None


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


# ---- lost workers ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recovering(mode: str, workers: int, *, restarts: bool = False) -> tuple[SchedulerState, list, Clock]:
    """Every worker registered (roles from the layout) on a clock the test moves."""
    sent: list[tuple[int, object]] = []
    clock = Clock()
    core = SchedulerState(
        workers, send=lambda w, item: sent.append((w, item)), clock=clock, mask_len=64, mode=mode,
        restarts=restarts,
    )  # fmt: skip
    for w, role in enumerate(core.layout.roles):
        assert core.register(registration(w, role.value)).error is None
    return core, sent, clock


def handed_off(core: SchedulerState, worker: int, rid: int = 0) -> IterationReport:
    ids = tuple(range(100, 132))
    entry = Prefilled(rid, 0, 101.0, 102.0, handoff=True, block_tokens=ids)
    return IterationReport(stats(worker), 0.1, prefilled=(entry,))


def test_a_lost_transfer_source_drops_the_destination_and_the_block_restarts_on_the_other_prefill() -> None:
    core, sent, _ = recovering("2P1D", 3)
    tracked = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,)))
    core.on_arrival(tracked)
    ((src, work),) = sent
    core.on_batch(ReportBatch(src, (handed_off(core, src),)))
    assert [(w, item.kind) for w, item in sent[1:]] == [(2, TransferKind.RECEIVE), (src, TransferKind.SEND)]
    sent.clear()

    core.on_worker_lost(src, "its process exited with status -9")
    other = 1 - src
    assert sent == [(2, DropOrder(0)), (other, work)]  # the destination forgets it; the block restarts
    assert tracked.state.status is RequestStatus.RUNNING and not core.failure
    assert core.status().recovery == RecoveryCounts(1, 1, 1, 0)
    assert core.status().workers[src].lost

    late = TransferEvent(TransferKind.RECEIVE, 0, 1, True, "", 103.0, 104.0)
    core.on_batch(ReportBatch(2, transfers=(late,)))  # the void transfer's receive: stale, no release
    assert core.refusal(ReportBatch(src, (handed_off(core, src),))) is not None
    core.on_batch(ReportBatch(src, (handed_off(core, src),)))  # the fenced worker: refused
    assert len(sent) == 2 and core.iterations == 1

    core.on_batch(ReportBatch(other, (handed_off(core, other),)))
    receive = sent[2][1]
    assert (
        isinstance(receive, TransferOrder) and receive.kind is TransferKind.RECEIVE and receive.peer == other
    )
    assert receive.generation == 0  # a pair without the lost worker keeps its link
    arrived = TransferEvent(TransferKind.RECEIVE, receive.transfer_id, 1, True, "", 105.0, 106.0)
    done = BlockDone(0, 0, tuple(range(100, 132)), 3, 107.0, decode_start=106.0)
    core.on_batch(ReportBatch(2, (IterationReport(stats(2), 0.1, finished=(done,)),), (arrived,)))
    assert tracked.state.status is RequestStatus.DONE and core.done == 1
    core.on_batch(
        ReportBatch(other, transfers=(TransferEvent(TransferKind.RELEASE, receive.transfer_id, 1, True),))
    )
    assert core.router is not None and core.router.free == [PAGES, PAGES, PAGES]
    assert core.transfers.in_flight == 0


def test_a_survivors_late_end_of_a_dropped_block_is_stale_when_the_block_restarts_there() -> None:
    """1P1C: the prefill worker is lost after its KV reached worker 1, which is told to drop it and
    is given the block again (an overflow). Its end of the dropped decode, reported before it saw the
    drop, is refused: the restarted block ends only after its own prefill."""
    core, sent, _ = recovering("1P1C", 2)
    tracked = core.submit(Submission(PROMPT, gen_len=64, forwards=(3, 3)))
    core.on_arrival(tracked)
    core.on_batch(ReportBatch(0, (handed_off(core, 0),)))
    arrived = TransferEvent(TransferKind.RECEIVE, 0, 1, True, "", 103.0, 104.0)
    core.on_batch(ReportBatch(1, transfers=(arrived,)))
    sent.clear()
    core.on_worker_lost(0, "its process was killed by SIGKILL")
    work = BlockWork(0, 100.0, 0, 20, 64, PROMPT, 3)
    assert sent == [(1, DropOrder(0)), (1, work)]

    first = tuple(range(100, 132))
    dropped = BlockDone(0, 0, first, 3, 105.0, decode_start=104.0)
    core.on_batch(ReportBatch(1, (IterationReport(stats(1), 0.1, finished=(dropped,), decoded=(0,)),)))
    assert tracked.state.blocks_done == 0 and tracked.req is not None and tracked.req.step == 0
    assert len(sent) == 2

    prefill, end = Prefilled(0, 0, 106.0, 107.0), BlockDone(0, 0, first, 3, 108.0)
    core.on_batch(ReportBatch(1, (IterationReport(stats(1), 0.1, prefilled=(prefill,), finished=(end,)),)))
    assert tracked.state.blocks_done == 1
    assert sent[2] == (1, BlockWork(0, 100.0, 1, 20, 64, PROMPT + first, 3))
    record = tracked.req.blocks[0]
    assert (record.prefill_start, record.prefill_end, record.end) == (106.0, 107.0, 108.0)


def test_a_layout_left_without_a_decode_worker_fails_its_requests_and_then_the_cluster() -> None:
    core, sent, _ = recovering("1P1D", 2)
    tracked = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,)))
    core.on_arrival(tracked)
    core.on_batch(ReportBatch(0, (handed_off(core, 0),)))
    sent.clear()
    core.on_worker_lost(1, "health check failed: DEADLINE_EXCEEDED")
    reason = "worker 1 was lost and 1P1D has no decode worker left"
    assert sent == [(0, DropOrder(0))]  # the source frees the KV it kept for the transfer
    assert (tracked.state.status, tracked.state.error) == (RequestStatus.ERROR, reason)
    assert core.status().recovery == RecoveryCounts(1, 0, 0, 1)
    assert (
        core.failure
        == "worker 1 lost (health check failed: DEADLINE_EXCEEDED) and 1P1D has no decode worker left"
    )


def test_with_restarts_coming_the_cluster_waits_and_a_new_process_takes_work_as_the_next_incarnation() -> (
    None
):
    core, sent, _ = recovering("colocated", 1, restarts=True)
    first = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,)))
    core.on_arrival(first)
    core.on_worker_lost(0, "its process exited with status -9")
    assert first.state.status is RequestStatus.ERROR and not core.failure
    waiting = core.submit(Submission(PROMPT, gen_len=32, forwards=(2,)))
    core.on_arrival(waiting)
    assert len(sent) == 1  # nowhere to go yet

    assert core.register(registration(0)).error == "worker 0 (pid 40) was declared lost"
    restarted = replace(registration(0), address="127.0.0.1:7100", pid=77)
    assert core.register(restarted) == Registered(None, 1)
    core.on_worker_joined(0)
    assert sent[1] == (0, BlockWork(1, 100.0, 0, 20, 32, PROMPT, 2))
    done = BlockDone(1, 0, tuple(range(100, 132)), 2, 103.0)
    report = IterationReport(stats(0), 0.1, prefilled=(Prefilled(1, 0, 101.0, 102.0),), finished=(done,))
    assert core.refusal(ReportBatch(0, (report,))) is not None  # the old process's incarnation
    core.on_batch(ReportBatch(0, (report,), incarnation=0))
    assert waiting.state.status is RequestStatus.RUNNING
    core.on_batch(ReportBatch(0, (report,), incarnation=1))
    assert waiting.state.status is RequestStatus.DONE and core.status().workers[0].pid == 77


def test_reports_of_unknown_workers_and_of_requests_the_sender_does_not_hold_change_nothing() -> None:
    core, sent, _ = recovering("2C", 2)
    tracked = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,), mask_len=64))
    core.on_arrival(tracked)
    ((holder, _),) = sent
    forged = IterationReport(
        stats(0), 0.1, prefilled=(Prefilled(0, 0, 101.0, 102.0),),
        finished=(BlockDone(0, 0, (7,) * 32, 1, 103.0),), decoded=(0,),
    )  # fmt: skip
    assert core.refusal(ReportBatch(5, (forged,))) == "no worker 5 is registered"
    core.on_batch(ReportBatch(5, (forged,)))
    core.on_batch(ReportBatch(1 - holder, (forged,)))
    assert tracked.state.status is RequestStatus.RUNNING and tracked.state.token_ids == ()
    assert tracked.req is not None and tracked.req.step == 0 and len(sent) == 1
    assert core.router is not None and core.router.outstanding[holder] == 84
    assert core.iterations == 1  # the registered non-holder's iteration happened; the unknown one's not


def test_a_worker_holding_work_is_lost_after_the_timeout_without_a_report_and_an_idle_one_never() -> None:
    core, sent, clock = recovering("2C", 2)
    core.lose_silent(5.0)  # the silence is counted from the first check
    tracked = core.submit(Submission(PROMPT, gen_len=32, forwards=(3,)))
    core.on_arrival(tracked)
    ((holder, work),) = sent
    clock.now += 4.0
    core.lose_silent(5.0)  # silent for 4 s only
    assert not any(w.lost for w in core.status().workers)
    prefill = IterationReport(stats(holder), 0.1, prefilled=(Prefilled(0, 0, 101.0, 102.0),))
    core.on_batch(ReportBatch(holder, (prefill, IterationReport(stats(holder), 0.1, decoded=(0,)))))
    clock.now += 4.0
    core.on_batch(ReportBatch(1 - holder))  # a heartbeat of the idle one
    core.lose_silent(5.0)
    assert not any(w.lost for w in core.status().workers)
    assert [w.forwards_at_risk for w in core.status().workers] == [2 if w == holder else 0 for w in (0, 1)]
    clock.now += 2.0
    core.lose_silent(5.0)
    assert [w.lost for w in core.status().workers] == [w == holder for w in (0, 1)]
    assert core.status().recovery == RecoveryCounts(1, 1, 2, 0)  # its prefill and one decode
    assert sent[1] == (1 - holder, replace(work, arrival=work.arrival))


def test_a_drop_issued_after_work_for_the_same_worker_goes_in_the_next_enqueue_call() -> None:
    from executor.control.scheduler_service import WorkerLink

    link = WorkerLink(0, "127.0.0.1:1", "secret")
    a, b = BlockWork(1, 0.0, 0, 20, 64, PROMPT), BlockWork(2, 0.0, 0, 20, 64, PROMPT)
    order = TransferOrder(TransferKind.RELEASE, 0, 1, 3, 0, peer=1, pages=6)
    for item in (DropOrder(1), DropOrder(4), a, order, DropOrder(2), b):
        link.outbox.put(item)
    assert link.next_batch() == WorkBatch((a,), (order,), (DropOrder(1), DropOrder(4)))
    assert link.next_batch() == WorkBatch((b,), (), (DropOrder(2),))  # the drop may be about `a`
    link.outbox.put(None)
    assert link.next_batch() is None
    link.channel.close()


def one_worker(mask_len: int) -> tuple[SchedulerState, list[tuple[int, object]]]:
    """A colocated scheduler whose server mask buffer (the largest a request may have) is `mask_len`."""
    sent: list[tuple[int, object]] = []
    ticks = itertools.count(100)
    core = SchedulerState(
        1, send=lambda w, item: sent.append((w, item)), clock=lambda: float(next(ticks)), mask_len=mask_len
    )
    assert core.register(registration(0)).error is None
    return core, sent


def test_a_request_is_sized_by_its_own_mask_buffer_not_the_servers() -> None:
    core, sent = one_worker(1024)
    short = core.submit(Submission(PROMPT, gen_len=64, forwards=(1, 1)))
    core.on_arrival(short)
    assert sent == [(0, BlockWork(0, 100.0, 0, 20, 64, PROMPT, 1))]  # the worker's sequence: 20 + 64
    assert short.req is not None and (short.req.seq_len, short.req.pages) == (84, 6)
    assert core.router is not None and core.router.outstanding == [84]
    sized = core.submit(Submission(PROMPT, gen_len=64, forwards=(1, 1), mask_len=256))
    core.on_arrival(sized)
    assert sent[1] == (0, BlockWork(1, 102.0, 0, 20, 256, PROMPT, 1))
    assert sized.req is not None and sized.req.pages == pages_for(20 + 256)
    assert core.router.outstanding == [84 + 276]


def test_admission_checks_the_requests_own_mask_buffer_against_the_pool_and_the_servers() -> None:
    core, _ = one_worker(1024)
    long = tuple([1] * 1000)  # 1000 + 64 tokens: 67 pages of 100; 1000 + 1024 tokens: 127
    assert core.submit(Submission(long, gen_len=64)).state.status is RequestStatus.QUEUED
    refusals = {
        Submission(long, gen_len=64, mask_len=1024): "prompt too long for the KV pool: 1000 prompt tokens "
        "plus a 1024-token mask buffer need 127 KV pages, a worker holds 100",
        Submission(
            PROMPT, gen_len=64, mask_len=1056
        ): "mask length 1056 exceeds the mask buffer of 1024 tokens",
        Submission(PROMPT, gen_len=1056): "gen length 1056 exceeds the mask buffer of 1024 tokens",
        Submission(
            PROMPT, gen_len=64, mask_len=48
        ): "mask length 48 must be a multiple of 32 no shorter than the gen length 64",
        Submission(
            PROMPT, gen_len=64, mask_len=32
        ): "mask length 32 must be a multiple of 32 no shorter than the gen length 64",
    }
    for sub, reason in refusals.items():
        tracked = core.submit(sub)
        assert (tracked.state.status, tracked.state.error, tracked.req) == (RequestStatus.ERROR, reason, None)


@settings(max_examples=80)
@given(
    prompt_len=st.integers(1, 2000),
    gen_blocks=st.integers(1, 40),
    extra_blocks=st.none() | st.integers(0, 40),
)
def test_an_admitted_request_holds_exactly_its_own_mask_buffers_pages(
    prompt_len: int, gen_blocks: int, extra_blocks: int | None
) -> None:
    core, _ = one_worker(1024)
    gen_len = 32 * gen_blocks
    own = gen_len if extra_blocks is None else gen_len + 32 * extra_blocks
    sub = Submission(tuple([1] * prompt_len), gen_len, mask_len=0 if extra_blocks is None else own)
    tracked = core.submit(sub)
    fits = own <= 1024 and pages_for(prompt_len + own) <= PAGES
    assert (tracked.req is not None) == fits, tracked.state.error
    if tracked.req is not None:
        assert tracked.req.seq_len == prompt_len + own and tracked.req.pages == pages_for(prompt_len + own)
        assert tracked.req.n_blocks == gen_blocks
