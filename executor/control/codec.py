"""The one place where the control plane's typed messages (`executor.control.messages`) meet protobuf: every
conversion between them and `executor/proto/sangam.proto`, each way that a process boundary needs."""

from __future__ import annotations

from executor.control.messages import (
    BlockDone,
    BlockWork,
    ClusterStatus,
    DropOrder,
    ItemShape,
    IterationReport,
    IterationStats,
    ModelFacts,
    Prefilled,
    Registered,
    Registration,
    ReportBatch,
    RequestState,
    RequestStatus,
    Sampling,
    Submission,
    Submitted,
    TransferEvent,
    TransferKind,
    TransferOrder,
    WatchBatch,
    WorkBatch,
    WorkerExit,
    WorkerState,
)
from executor.proto import sangam_pb2 as pb
from sangam.request import BlockRecord, Request
from sangam.results import RecoveryCounts

_STATUS = {
    RequestStatus.QUEUED: pb.QUEUED,
    RequestStatus.RUNNING: pb.RUNNING,
    RequestStatus.DONE: pb.DONE,
    RequestStatus.ERROR: pb.ERROR,
    RequestStatus.NOT_FOUND: pb.NOT_FOUND,
}
_STATUS_OF = {v: k for k, v in _STATUS.items()}
_KIND = {TransferKind.SEND: pb.SEND, TransferKind.RECEIVE: pb.RECEIVE, TransferKind.RELEASE: pb.RELEASE}
_KIND_OF = {v: k for k, v in _KIND.items()}
_TIMES = ("dispatch", "prefill_start", "prefill_end", "transfer_start", "transfer_end", "decode_start", "end")
_WORKERS = ("prefill_worker", "decode_worker")

# ---- clients <-> scheduler ---------------------------------------------------------------------------


def sampling_to_pb(sampling: Sampling) -> pb.SamplingParams:
    msg = pb.SamplingParams()
    for name in ("threshold", "temperature", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def sampling_from_pb(msg: pb.SamplingParams) -> Sampling:
    return Sampling(
        threshold=msg.threshold if msg.HasField("threshold") else None,
        temperature=msg.temperature if msg.HasField("temperature") else None,
        seed=msg.seed if msg.HasField("seed") else None,
    )


def request_ref(request_id: int) -> pb.RequestRef:
    return pb.RequestRef(request_id=request_id)


def status_request() -> pb.StatusRequest:
    return pb.StatusRequest()


def results_request(first: int = 0) -> pb.ResultsRequest:
    return pb.ResultsRequest(first=first)


def shutdown_request() -> pb.ShutdownRequest:
    return pb.ShutdownRequest()


def submission_to_pb(sub: Submission) -> pb.SubmitRequest:
    return pb.SubmitRequest(
        prompt_token_ids=sub.prompt, gen_len=sub.gen_len, sampling=sampling_to_pb(sub.sampling),
        forwards=sub.forwards, watch=sub.watch,
    )  # fmt: skip


def submission_from_pb(msg: pb.SubmitRequest) -> Submission:
    return Submission(
        tuple(msg.prompt_token_ids), msg.gen_len, sampling_from_pb(msg.sampling), tuple(msg.forwards),
        msg.watch,
    )  # fmt: skip


def state_to_pb(state: RequestState) -> pb.RequestState:
    return pb.RequestState(
        request_id=state.request_id,
        status=_STATUS[state.status],
        error=state.error,
        token_ids=state.token_ids,
        blocks_done=state.blocks_done,
        n_blocks=state.n_blocks,
        eos=state.eos,
        arrival=state.arrival,
        end=state.end,
        forwards=state.forwards,
        queue_s=state.queue_s,
        prefill_s=state.prefill_s,
        decode_s=state.decode_s,
        transfer_s=state.transfer_s,
        overflow_blocks=state.overflow_blocks,
    )


def state_from_pb(msg: pb.RequestState) -> RequestState:
    return RequestState(
        request_id=msg.request_id,
        status=_status_from_pb(msg.status),
        error=msg.error,
        token_ids=tuple(msg.token_ids),
        blocks_done=msg.blocks_done,
        n_blocks=msg.n_blocks,
        eos=msg.eos,
        arrival=msg.arrival,
        end=msg.end,
        forwards=tuple(msg.forwards),
        queue_s=msg.queue_s,
        prefill_s=msg.prefill_s,
        decode_s=msg.decode_s,
        transfer_s=tuple(msg.transfer_s),
        overflow_blocks=msg.overflow_blocks,
    )


def watch_batch_to_pb(batch: WatchBatch) -> pb.StateBatch:
    return pb.StateBatch(
        states=[state_to_pb(state) for state in batch.states],
        submitted=[
            pb.Submitted(tag=s.tag, reply=submit_reply(s.state) if s.state is not None else None,
                         unavailable=s.unavailable)
            for s in batch.submitted
        ],
    )  # fmt: skip


def watch_batch_from_pb(msg: pb.StateBatch) -> WatchBatch:
    submitted = [
        Submitted(s.tag, None if s.unavailable else submit_reply_from_pb(s.reply), s.unavailable)
        for s in msg.submitted
    ]
    return WatchBatch([state_from_pb(state) for state in msg.states], submitted)


def watch_submit(tag: int, sub: Submission) -> pb.WatchRequest:
    return pb.WatchRequest(tag=tag, submit=submission_to_pb(sub))


def _status_from_pb(value: int) -> RequestStatus:
    status = _STATUS_OF.get(value)  # type: ignore[call-overload]
    if status is None:
        raise ValueError(f"unknown request status {value}")
    return status


def submit_reply(state: RequestState) -> pb.SubmitReply:
    return pb.SubmitReply(request_id=state.request_id, status=_STATUS[state.status], error=state.error)


def submit_reply_from_pb(msg: pb.SubmitReply) -> RequestState:
    """The accepted (QUEUED) or refused (ERROR, with the reason) request a Submit reply names."""
    return RequestState(msg.request_id, _status_from_pb(msg.status), msg.error)


def status_to_pb(status: ClusterStatus) -> pb.StatusReply:
    reply = pb.StatusReply(
        ready=status.ready,
        workers_expected=status.workers_expected,
        workers_registered=status.workers_registered,
        submitted=status.submitted,
        done=status.done,
        errors=status.errors,
        iterations=status.iterations,
        failure=status.failure,
        mask_len=status.mask_len,
        layout=status.layout,
        transfers_done=status.transfers_done,
        transfers_failed=status.transfers_failed,
        transfer_retries=status.transfer_retries,
        transfers_in_flight=status.transfers_in_flight,
        first_arrival=status.first_arrival,
        workers_lost=status.recovery.workers_lost,
        requests_recovered=status.recovery.requests_recovered,
        forwards_redone=status.recovery.forwards_redone,
        requests_failed=status.recovery.requests_failed,
    )
    for w in status.workers:
        reply.workers.add(
            worker_id=w.worker_id,
            role=w.role,
            pages=w.pages,
            free_pages=w.free_pages,
            router_free=w.router_free,
            outstanding=w.outstanding,
            lost=w.lost,
            pid=w.pid,
        )
    facts = status.facts
    if facts is not None:
        reply.vocab, reply.mask_id, reply.pages, reply.model, reply.context_len = (
            facts.vocab,
            facts.mask_id,
            facts.pages,
            facts.model,
            facts.context_len,
        )
        reply.eos_ids.extend(facts.eos_ids)
    return reply


def status_from_pb(msg: pb.StatusReply) -> ClusterStatus:
    workers = tuple(
        WorkerState(w.worker_id, w.role, w.pages, w.free_pages, w.router_free, w.outstanding, w.lost, w.pid)
        for w in msg.workers
    )
    facts = (
        ModelFacts(msg.vocab, msg.mask_id, tuple(msg.eos_ids), msg.pages, msg.model, msg.context_len)
        if msg.vocab
        else None
    )
    return ClusterStatus(
        ready=msg.ready,
        workers_expected=msg.workers_expected,
        workers_registered=msg.workers_registered,
        submitted=msg.submitted,
        done=msg.done,
        errors=msg.errors,
        iterations=msg.iterations,
        failure=msg.failure,
        mask_len=msg.mask_len,
        layout=msg.layout,
        transfers_done=msg.transfers_done,
        transfers_failed=msg.transfers_failed,
        transfer_retries=msg.transfer_retries,
        transfers_in_flight=msg.transfers_in_flight,
        first_arrival=msg.first_arrival,
        workers=workers,
        facts=facts,
        recovery=recovery_from_pb(msg),
    )


def empty_status() -> ClusterStatus:
    """The status of a scheduler never heard from: nothing registered, submitted or done."""
    return status_from_pb(pb.StatusReply())


def record_of(req: Request) -> pb.RequestRecord:
    """The timing record of a finished request (sangam.results rebuilds its rows from it)."""
    record = pb.RequestRecord(
        request_id=req.id,
        arrival=req.arrival,
        prompt_len=req.prompt_len,
        output_len=req.output_len,
        mask_len=req.mask_len,
        forwards=list(req.steps),
    )
    for rec in req.blocks:
        times = record.blocks.add(ready=rec.ready, overflow=rec.overflow)
        for name in (*_TIMES, *_WORKERS):
            value = getattr(rec, name)
            if value is not None:
                setattr(times, name, value)
    return record


def request_from_record(record: pb.RequestRecord, *, shift: float = 0.0) -> Request:
    """A finished `Request` rebuilt from its record, every time moved by `-shift`."""
    blocks = []
    for times in record.blocks:
        rec = BlockRecord(ready=times.ready - shift, overflow=times.overflow)
        for name in _WORKERS:
            if times.HasField(name):
                setattr(rec, name, getattr(times, name))
        for name in _TIMES:
            if times.HasField(name):
                setattr(rec, name, getattr(times, name) - shift)
        blocks.append(rec)
    req = Request(
        record.request_id,
        record.arrival - shift,
        record.prompt_len,
        record.output_len,
        record.mask_len,
        tuple(record.forwards),
        blocks=blocks,
    )
    req.block = len(blocks)
    return req


# ---- workers -> scheduler ----------------------------------------------------------------------------


def registration_to_pb(reg: Registration) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        worker_id=reg.worker_id,
        address=reg.address,
        pages=reg.pages,
        vocab=reg.vocab,
        mask_id=reg.mask_id,
        eos_ids=reg.eos_ids,
        model=reg.model,
        device=reg.device,
        pid=reg.pid,
        role=reg.role,
        context_len=reg.context_len,
    )


def registration_from_pb(msg: pb.RegisterRequest) -> Registration:
    return Registration(
        msg.worker_id, msg.address, msg.pages, msg.vocab, msg.mask_id, tuple(msg.eos_ids), msg.model,
        msg.device, msg.pid, msg.role, msg.context_len,
    )  # fmt: skip


def register_reply(answer: Registered) -> pb.RegisterReply:
    return pb.RegisterReply(
        accepted=answer.error is None, error=answer.error or "", incarnation=answer.incarnation
    )


def registered_from_pb(msg: pb.RegisterReply) -> Registered:
    return Registered(None if msg.accepted else msg.error, msg.incarnation)


def exit_to_pb(exit: WorkerExit) -> pb.WorkerExit:
    return pb.WorkerExit(worker_id=exit.worker_id, pid=exit.pid, reason=exit.reason)


def exit_from_pb(msg: pb.WorkerExit) -> WorkerExit:
    return WorkerExit(msg.worker_id, msg.pid, msg.reason)


def recovery_from_pb(msg: pb.StatusReply) -> RecoveryCounts:
    """The recovery counts of a status reply (the summary's keys)."""
    return RecoveryCounts(msg.workers_lost, msg.requests_recovered, msg.forwards_redone, msg.requests_failed)


def _event_to_pb(event: TransferEvent) -> pb.TransferEvent:
    return pb.TransferEvent(
        kind=_KIND[event.kind], transfer_id=event.transfer_id, attempt=event.attempt, ok=event.ok,
        error=event.error, start=event.start, end=event.end, bytes=event.nbytes,
    )  # fmt: skip


def _event_from_pb(msg: pb.TransferEvent) -> TransferEvent:
    return TransferEvent(
        _KIND_OF[msg.kind], msg.transfer_id, msg.attempt, msg.ok, msg.error, msg.start, msg.end, msg.bytes
    )


def _report_to_pb(report: IterationReport) -> pb.IterationReport:
    s = report.stats
    msg = pb.IterationReport(
        stats=pb.IterationStats(
            worker=s.worker, start=s.start, end=s.end, n_decodes=s.n_decodes, decode_tokens=s.decode_tokens,
            n_prefills=s.n_prefills, prefill_tokens=s.prefill_tokens, waiting_prefills=s.waiting_prefills,
            deficit_before=s.deficit_before, budget=s.budget, deficit_after=s.deficit_after,
            memory_blocked=s.memory_blocked,
        ),
        gpu_s=report.gpu_s,
        cycle_s=report.cycle_s,
        decoded=report.decoded,
    )  # fmt: skip
    for item in report.items:
        kind = pb.PREFILL if item.prefill else pb.DECODE
        msg.items.add(kind=kind, query_tokens=item.query_tokens, context_len=item.context_len)
    for p in report.prefilled:
        msg.prefilled.add(
            request_id=p.request_id, block=p.block, prefill_start=p.prefill_start, prefill_end=p.prefill_end,
            handoff=p.handoff, block_tokens=p.block_tokens,
        )  # fmt: skip
    for d in report.finished:
        entry = msg.finished.add(
            request_id=d.request_id, block=d.block, tokens=d.tokens, forwards=d.forwards, end=d.end, eos=d.eos
        )
        if d.decode_start is not None:
            entry.decode_start = d.decode_start
    return msg


def _report_from_pb(msg: pb.IterationReport) -> IterationReport:
    s = msg.stats
    stats = IterationStats(
        s.worker, s.start, s.end, s.n_decodes, s.decode_tokens, s.n_prefills, s.prefill_tokens,
        s.waiting_prefills, s.deficit_before, s.budget, s.deficit_after, s.memory_blocked,
    )  # fmt: skip
    return IterationReport(
        stats=stats,
        gpu_s=msg.gpu_s,
        items=tuple(ItemShape(i.kind == pb.PREFILL, i.query_tokens, i.context_len) for i in msg.items),
        prefilled=tuple(
            Prefilled(p.request_id, p.block, p.prefill_start, p.prefill_end, p.handoff, tuple(p.block_tokens))
            for p in msg.prefilled
        ),
        finished=tuple(
            BlockDone(
                d.request_id,
                d.block,
                tuple(d.tokens),
                d.forwards,
                d.end,
                d.eos,
                d.decode_start if d.HasField("decode_start") else None,
            )
            for d in msg.finished
        ),
        cycle_s=msg.cycle_s,
        decoded=tuple(msg.decoded),
    )


def reports_to_pb(batch: ReportBatch) -> pb.ReportBatch:
    msg = pb.ReportBatch(
        worker_id=batch.worker_id,
        iterations=[_report_to_pb(r) for r in batch.iterations],
        transfers=[_event_to_pb(e) for e in batch.transfers],
        incarnation=batch.incarnation,
    )
    if batch.free_pages is not None:
        msg.free_pages = batch.free_pages
    return msg


def reports_from_pb(msg: pb.ReportBatch) -> ReportBatch:
    return ReportBatch(
        msg.worker_id,
        tuple(_report_from_pb(r) for r in msg.iterations),
        tuple(_event_from_pb(e) for e in msg.transfers),
        msg.free_pages if msg.HasField("free_pages") else None,
        msg.incarnation,
    )


# ---- scheduler -> workers ----------------------------------------------------------------------------


def _work_to_pb(work: BlockWork) -> pb.BlockWork:
    return pb.BlockWork(
        request_id=work.request_id, arrival=work.arrival, block=work.block, prompt_len=work.prompt_len,
        mask_len=work.mask_len, tokens=work.tokens, forwards=work.forwards,
        sampling=sampling_to_pb(work.sampling),
    )  # fmt: skip


def _work_from_pb(msg: pb.BlockWork) -> BlockWork:
    return BlockWork(
        msg.request_id, msg.arrival, msg.block, msg.prompt_len, msg.mask_len, tuple(msg.tokens),
        msg.forwards, sampling_from_pb(msg.sampling),
    )  # fmt: skip


def _order_to_pb(order: TransferOrder) -> pb.TransferOrder:
    msg = pb.TransferOrder(
        kind=_KIND[order.kind], transfer_id=order.transfer_id, attempt=order.attempt,
        request_id=order.request_id, block=order.block, peer=order.peer, generation=order.generation,
        tag=order.tag, pages=order.pages, block_tokens=order.block_tokens, step=order.step,
    )  # fmt: skip
    if order.work is not None:
        msg.work.CopyFrom(_work_to_pb(order.work))
    return msg


def _order_from_pb(msg: pb.TransferOrder) -> TransferOrder:
    return TransferOrder(
        _KIND_OF[msg.kind], msg.transfer_id, msg.attempt, msg.request_id, msg.block, msg.peer, msg.pages,
        msg.generation, msg.tag, _work_from_pb(msg.work) if msg.HasField("work") else None,
        tuple(msg.block_tokens), msg.step,
    )  # fmt: skip


def work_to_pb(batch: WorkBatch) -> pb.EnqueueBatch:
    return pb.EnqueueBatch(
        blocks=[_work_to_pb(w) for w in batch.blocks],
        transfers=[_order_to_pb(o) for o in batch.orders],
        drops=[pb.DropOrder(request_id=d.request_id) for d in batch.drops],
    )


def work_from_pb(msg: pb.EnqueueBatch) -> WorkBatch:
    return WorkBatch(
        tuple(_work_from_pb(w) for w in msg.blocks),
        tuple(_order_from_pb(o) for o in msg.transfers),
        tuple(DropOrder(d.request_id) for d in msg.drops),
    )
