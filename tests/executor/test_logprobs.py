"""Log-probs on the worker (CPU, a one-layer tiny model, whose dual KV cache is exact: every forward's
logits equal a dense forward of the sequence as it stood): each committed token's log-prob and its
alternatives are those of the forward that committed it, recomputed here independently in float64; a
handed-off block keeps its prefill's through the scheduler and the wire; no extra work when nobody asks."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from executor_helpers import dense_block_logits, reshaped
from torch import Tensor

from executor.control import codec
from executor.control.messages import (
    BlockWork,
    IterationReport,
    Logprobs,
    Registration,
    ReportBatch,
    RequestStatus,
    Sampling,
    Submission,
    TransferEvent,
    TransferKind,
    TransferOrder,
)
from executor.control.scheduler_state import SchedulerState
from executor.model.attention import TorchAttention
from executor.model.config import Family, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.transformer import Transformer
from executor.transfer.links import TransferJob, TransferResult
from executor.worker import logprobs as worker_logprobs
from executor.worker.engine import Engine
from sangam.batcher import Batcher
from sangam.budget import BatchConfig
from sangam.hardware import BLOCK
from sangam.kv import PagePool

ATOL = 1e-4  # paged against dense attention, float32
Forward = tuple[Tensor, int, Tensor]  # the sequence before a forward, its block's start, the block after


def one_layer(family: Family) -> Transformer:
    return random_model(reshaped(tiny(family), layers=1), dtype=torch.float32, seed=3, std=0.2)


def engine(model: Transformer, *, hand_off: bool = False, links: Any = None) -> Engine:
    pool = PagePool(32)
    cache = PagedKVCache.for_model(pool, model.config, dtype=torch.float32, device="cpu")
    batcher = Batcher(0, BatchConfig(), pool, hand_off=hand_off)
    return Engine(0, model, batcher, ModelRunner(model, cache, TorchAttention()), transfers=links)


def prompt(length: int, seed: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, 290, (length,), generator=torch.Generator().manual_seed(seed)).tolist())


def step(e: Engine, seen: dict[int, list[Forward]]) -> IterationReport:
    """One iteration, each item's forward recorded under its request."""
    before = {j.request_id: (j.tokens.clone(), j.block_start) for j in e.jobs.values()}
    report = e.step()
    assert report is not None
    after = {j.request_id: j.tokens for j in e.jobs.values()}
    finished = {d.request_id: torch.tensor(d.tokens) for d in report.finished}
    for rid, (tokens, start) in before.items():
        block = finished[rid] if rid in finished else after[rid][start : start + BLOCK].clone()
        seen.setdefault(rid, []).append((tokens, start, block))
    return report


def check(model: Transformer, forwards: list[Forward], logprobs: Logprobs, top: int) -> None:
    """Every position was committed by exactly one of `forwards`, and its log-prob and alternatives are
    that forward's: the log-softmax of its logits (the mask id's probability in the normalisation; the mask
    id never among the alternatives)."""
    mask = model.config.mask_id
    assert logprobs.top == top and len(logprobs.token) == BLOCK
    committed = torch.zeros(BLOCK, dtype=torch.bool)
    for tokens, start, block in forwards:
        new = (tokens[start : start + BLOCK] == mask) & (block != mask)
        assert not (committed & new).any()
        committed |= new
        reference = torch.log_softmax(dense_block_logits(model, tokens, start).double(), dim=-1)
        listed = reference.clone()
        listed[:, mask] = -math.inf
        for p in new.nonzero().flatten().tolist():
            assert logprobs.token[p] == pytest.approx(float(reference[p, block[p]]), abs=ATOL)
            alternatives = logprobs.alternatives(p)
            best = listed[p].topk(top).values.tolist()
            assert [lp for _, lp in alternatives] == pytest.approx(best, abs=ATOL)
            assert [float(reference[p, t]) for t, _ in alternatives] == pytest.approx(best, abs=ATOL)
    assert committed.all()


@pytest.mark.parametrize("family", list(Family))
def test_each_tokens_logprob_is_the_one_of_the_forward_that_committed_it(family: Family) -> None:
    """A batch of requests that ask and one that does not, by threshold (at a temperature: the sampler
    draws from the tempered distribution, the log-probs stay raw) and by a schedule of 4 forwards."""
    model = one_layer(family)
    e = engine(model)
    asks = {
        1: (0, Sampling(temperature=0.7, logprobs=3)),
        2: (4, Sampling()),
        3: (4, Sampling(logprobs=0)),
        4: (0, Sampling(logprobs=20)),
    }
    for rid, (forwards, sampling) in asks.items():
        e.admit(BlockWork(rid, 0.0, 0, 10 + rid, BLOCK, prompt(10 + rid, rid), forwards, sampling))
    seen: dict[int, list[Forward]] = {}
    done = {}
    while len(done) < len(asks):
        done |= {d.request_id: d for d in step(e, seen).finished}
    assert done[2].logprobs is None
    for rid in (1, 3, 4):
        logprobs = done[rid].logprobs
        assert logprobs is not None
        top = asks[rid][1].logprobs
        assert top is not None
        check(model, seen[rid], logprobs, top)
    assert len(seen[1]) > 4  # threshold mode on random weights: a forward commits one or few


def test_an_iteration_that_nobody_asks_for_computes_no_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("log-probs computed for nobody")

    monkeypatch.setattr(worker_logprobs.ForwardScores, "launch", refuse)
    e = engine(one_layer(Family.LLADA))
    e.admit(BlockWork(1, 0.0, 0, 12, BLOCK, prompt(12, 1), 2))
    reports = [step(e, {}), step(e, {})]
    assert [d.logprobs for d in reports[1].finished] == [None]


class Links:
    """KV links whose receives the test carries out itself."""

    def __init__(self) -> None:
        self.received: list[TransferJob] = []

    def receive(self, peer: int, job: TransferJob) -> None:
        self.received.append(job)


def wire(message: Any) -> Any:
    """`message` as the process at the other end of the control plane reads it."""
    return codec.from_pb(codec.to_pb(message), type(message))


def test_a_handed_off_block_keeps_its_prefills_logprobs_through_the_scheduler_and_the_wire() -> None:
    model = one_layer(Family.LLADA)
    config = model.config
    sent: list[tuple[int, Any]] = []
    core = SchedulerState(2, send=lambda w, item: sent.append((w, item)), clock=lambda: 1.0, mask_len=BLOCK,
                          mode="1P1D")  # fmt: skip
    for worker, role in ((0, "prefill"), (1, "decode")):
        facts = (config.shape.vocab, config.mask_id, config.eos_ids)
        core.register(Registration(worker, "-", 32, *facts, "tiny", "cpu", worker, role, config.context_len))
    tracked = core.submit(Submission(prompt(15, 7), BLOCK, Sampling(logprobs=2), forwards=(4,)))
    core.on_arrival(tracked)
    source, links = engine(model, hand_off=True), Links()
    destination = engine(model, links=links)
    seen: dict[int, list[Forward]] = {}

    ((worker, work),) = sent
    source.admit(wire(work))
    report = step(source, seen)
    (prefilled,) = report.prefilled
    assert prefilled.handoff and prefilled.block_logprobs is not None
    core.on_batch(wire(ReportBatch(0, (report,))))
    receive = next(o for w, o in sent if isinstance(o, TransferOrder) and o.kind is TransferKind.RECEIVE)
    events: list[TransferEvent] = []
    destination.emit = events.append
    destination.transfer(wire(receive))
    (job,) = links.received
    local = source.ends.handed[tracked.id, 0]
    kept = torch.tensor(source.batcher.pool.pages_of(local))
    for theirs, ours in zip(source.runner.cache.layers, destination.runner.cache.layers, strict=True):
        ours[torch.tensor(job.pages)] = theirs[kept]  # the transfer's bytes
    destination.transfer_done(TransferResult(False, job, 0, True, "", 2.0, 2.0, 0))
    while tracked.state.status is not RequestStatus.DONE:
        report = step(destination, seen)
        core.on_batch(wire(ReportBatch(1, (report,), tuple(events))))
        events.clear()
    logprobs = tracked.state.logprobs
    assert logprobs is not None
    check(model, seen[tracked.id], wire(tracked.state).logprobs, 2)
    at_prefill = [p for p, t in enumerate(prefilled.block_tokens) if t != config.mask_id]
    assert len(at_prefill) == BLOCK // 4
    assert all(logprobs.token[p] == prefilled.block_logprobs.token[p] for p in at_prefill)
