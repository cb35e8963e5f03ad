"""The live control plane's messages as typed values: what the scheduler, the workers and their clients say
to each other. No protobuf here: `executor.control.codec` converts at the process boundary.

Times are seconds of the host's `time.monotonic()`, which every process of one host shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum

from runs.results import RecoveryCounts


class RequestStatus(StrEnum):
    """A request's status; each value is its name (as in sangam.proto), so it compares equal to "DONE"."""

    QUEUED = "QUEUED"  # accepted, first block not yet dispatched
    RUNNING = "RUNNING"  # a block is dispatched to a worker or being denoised
    DONE = "DONE"
    ERROR = "ERROR"  # `error` says why: bad input, a failed transfer, or the cluster failed
    NOT_FOUND = "NOT_FOUND"  # a poll or stream of an unknown id

    @property
    def terminal(self) -> bool:
        return self in (RequestStatus.DONE, RequestStatus.ERROR)


class TransferKind(Enum):
    SEND = "send"  # source: pack the block's pages and send them to the peer
    RECEIVE = "receive"  # destination: allocate pages, receive from the peer, then decode the work
    RELEASE = "release"  # source: free the block's pages


MAX_TOP_LOGPROBS = 20  # alternatives per token a request may ask the log-probs of (OpenAI's bound)


@dataclass(frozen=True, slots=True)
class Sampling:
    """A request's sampling options; None: the worker's default (threshold 0.9, argmax, seed = id)."""

    threshold: float | None = None
    temperature: float | None = None
    seed: int | None = None
    # None: no log-probs; k: each committed token's, and its position's k most likely tokens' (`Logprobs`)
    logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Log-probabilities of a run of committed tokens, one entry per token in their order: the token's own
    in the forward that committed it, and the `top` most likely tokens of that forward at its position with
    theirs, most likely first. All are the log-softmax of that forward's raw logits (no temperature), the
    mask id's probability included in the normalisation though it is never proposed nor listed: the
    token's is the log of the confidence the threshold compares (docs/serve.md, "Log-probabilities").
    A position not yet committed (a handed-off block's masks) holds NaN."""

    token: tuple[float, ...] = ()
    top: int = 0  # alternatives per token
    top_ids: tuple[int, ...] = ()  # token i's alternatives are items [i * top, (i + 1) * top)
    top_logprobs: tuple[float, ...] = ()

    def __add__(self, other: Logprobs) -> Logprobs:
        """The entries of `self`, then those of `other` (of the same `top`)."""
        if self.token and other.token and self.top != other.top:
            raise ValueError(f"log-probs of {self.top} and {other.top} alternatives do not join")
        top = self.top if self.token else other.top
        return Logprobs(self.token + other.token, top, self.top_ids + other.top_ids,
                        self.top_logprobs + other.top_logprobs)  # fmt: skip

    def alternatives(self, i: int) -> list[tuple[int, float]]:
        """Token i's alternatives: (id, log-prob), most likely first."""
        span = slice(i * self.top, (i + 1) * self.top)
        return list(zip(self.top_ids[span], self.top_logprobs[span], strict=True))


# ---- clients <-> scheduler ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submission:
    """One request as a client submits it: token ids only. Its mask buffer (`response_len`) is its own:
    `gen_len` unless `mask_len` says otherwise; the server's mask buffer is the largest allowed."""

    prompt: tuple[int, ...]
    gen_len: int  # a positive multiple of 32: the tokens it generates at most
    sampling: Sampling = Sampling()
    forwards: tuple[int, ...] = ()  # forced forwards of each block; empty: the sampler decides
    watch: bool = False  # its updates go to the scheduler's Watch streams
    mask_len: int = 0  # its mask buffer, a multiple of 32 of at least gen_len; 0: gen_len

    @property
    def response_len(self) -> int:
        """The request's mask buffer in tokens: what its KV pages and every prefill are sized by."""
        return self.mask_len or self.gen_len


@dataclass(frozen=True, slots=True)
class RequestState:
    """A request as clients see it; a published state is never changed (a new one replaces it)."""

    request_id: int
    status: RequestStatus
    error: str = ""
    token_ids: tuple[int, ...] = ()  # generated so far: the committed blocks, EOS included
    blocks_done: int = 0
    n_blocks: int = 0
    eos: bool = False  # generation stopped early at an EOS
    arrival: float = 0.0
    end: float = 0.0  # 0 until DONE
    forwards: tuple[int, ...] = ()  # forwards each finished block took
    # once DONE: the latency parts summed over the blocks (runs.results.PARTS), seconds
    queue_s: float = 0.0  # prefill queue and decode queue
    prefill_s: float = 0.0
    decode_s: float = 0.0
    transfer_s: tuple[float, ...] = ()  # each KV transfer's duration
    overflow_blocks: int = 0  # blocks whose prefill overflowed to a colocated worker (hybrid)
    logprobs: Logprobs | None = None  # asked for (`Sampling.logprobs`): one entry per id of `token_ids`

    @property
    def finished(self) -> bool:
        """Nothing more will change: DONE, ERROR, or an unknown id."""
        return self.status.terminal or self.status is RequestStatus.NOT_FOUND


@dataclass(frozen=True, slots=True)
class Submitted:
    """The answer to a Submit sent on a Watch stream, under the client's tag: the request's first state
    (as a Submit call's reply), or why the scheduler takes no request now (`unavailable`)."""

    tag: int
    state: RequestState | None
    unavailable: str = ""


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """One message of a Watch stream: the latest state of each watched request that changed, and the
    answers to the Submits sent on the stream since the last."""

    states: list[RequestState]
    submitted: list[Submitted]


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What Submit validates against, from the workers' registrations."""

    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    pages: int  # the smallest worker pool
    model: str
    context_len: int  # the model's context window: prompt plus mask buffer must fit it


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker as the scheduler sees it: what it registered, last reported, and the router's tally."""

    worker_id: int
    role: str
    pages: int
    free_pages: int  # when it last reported (its registered pages until then)
    router_free: int = 0  # the router's tally of its free pages (disaggregated and hybrid layouts)
    outstanding: int = 0  # prefill tokens dispatched to it and not yet prefilled
    lost: bool = False  # declared lost (and fenced) until a new process registers for it
    pid: int = 0  # of the process that registered last
    device: str = ""  # the device it registered (e.g. cpu, or cuda:0 (NVIDIA H200))
    lost_reason: str = ""  # why it was declared lost (empty unless lost)
    forwards_at_risk: int = 0  # forwards its held blocks have run: what losing it now would redo


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    ready: bool  # every worker registered and no failure
    workers_expected: int
    workers_registered: int
    submitted: int
    done: int
    errors: int
    iterations: int
    failure: str
    mask_len: int  # the largest mask buffer a request may have (`--mask-len`)
    layout: str
    transfers_done: int
    transfers_failed: int
    transfer_retries: int
    transfers_in_flight: int
    first_arrival: float  # the first accepted submission (0: none): the runs' time origin
    workers: tuple[WorkerState, ...]
    facts: ModelFacts | None  # None until every worker has registered
    recovery: RecoveryCounts = field(default_factory=RecoveryCounts)


# ---- workers -> scheduler ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Registration:
    worker_id: int
    address: str  # host:port of the worker's service
    pages: int
    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    model: str
    device: str
    pid: int
    role: str  # colocated, prefill or decode: must match the scheduler's layout
    context_len: int  # the model's context window in tokens


@dataclass(frozen=True, slots=True)
class ItemShape:
    prefill: bool  # else a decode
    query_tokens: int
    context_len: int


@dataclass(frozen=True, slots=True)
class IterationStats:
    """The Batcher's view of one iteration; the fields are `runs.results.ITERATION_COLUMNS`."""

    worker: int
    start: float
    end: float
    n_decodes: int
    decode_tokens: int
    n_prefills: int
    prefill_tokens: int
    waiting_prefills: int
    deficit_before: int
    budget: float  # inf under prefill-first
    deficit_after: int
    memory_blocked: int


@dataclass(frozen=True, slots=True)
class Prefilled:
    request_id: int
    block: int
    prefill_start: float
    prefill_end: float
    handoff: bool = False  # a prefill worker keeps the KV for a transfer
    block_tokens: tuple[int, ...] = ()  # handoff: the block's 32 ids after the prefill's unmasking
    block_logprobs: Logprobs | None = None  # handoff, if asked: theirs (NaN where still masked)


@dataclass(frozen=True, slots=True)
class BlockDone:
    request_id: int
    block: int
    tokens: tuple[int, ...]  # the block's 32 committed ids
    forwards: int
    end: float
    eos: bool = False  # an EOS id was committed in this block
    decode_start: float | None = None  # None when the prefill finished the block
    logprobs: Logprobs | None = None  # asked for (`Sampling.logprobs`): the 32 tokens'


@dataclass(frozen=True, slots=True)
class IterationReport:
    stats: IterationStats
    gpu_s: float  # measured forward time (CUDA events on GPU, perf_counter on CPU)
    items: tuple[ItemShape, ...] = ()
    prefilled: tuple[Prefilled, ...] = ()
    finished: tuple[BlockDone, ...] = ()
    # From `stats.start` to the worker's next iteration start when its loop went straight on (reporting
    # and admitting included); 0 when it next waited for work.
    cycle_s: float = 0.0
    decoded: tuple[int, ...] = ()  # the requests whose block had a decode forward in this iteration


@dataclass(frozen=True, slots=True)
class TransferEvent:
    """What one end of a transfer attempt did: SEND, the send ended; RECEIVE, the KV is in place (ok) or
    not; RELEASE, the source's pages are free."""

    kind: TransferKind
    transfer_id: int
    attempt: int
    ok: bool
    error: str = ""  # one line, when not ok
    start: float = 0.0
    end: float = 0.0
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class ReportBatch:
    """One worker's reports since its last batch; the transfer events are handled first (a RECEIVE event
    precedes every report of the decode it allows)."""

    worker_id: int
    iterations: tuple[IterationReport, ...] = ()
    transfers: tuple[TransferEvent, ...] = ()
    free_pages: int | None = None  # the worker's free KV pages when the batch was sent
    incarnation: int = 0  # the sending process's registration number (`Registered.incarnation`)


@dataclass(frozen=True, slots=True)
class Registered:
    """The scheduler's answer to a registration: refused (`error`), or accepted as `incarnation`, a number
    every report of the process carries (reports of an older incarnation are refused)."""

    error: str | None
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """The launcher saw worker `worker_id`'s process `pid` exit: the worker is lost (and, if `final`, no
    new process will follow: the launcher gave it up)."""

    worker_id: int
    pid: int
    reason: str
    final: bool = False


# ---- scheduler -> workers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockWork:
    """One block of one request for a worker to prefill and denoise."""

    request_id: int
    arrival: float  # the request's original arrival: orders the worker's prefill queue
    block: int
    prompt_len: int
    mask_len: int  # the request's own mask buffer: the sequence is prompt_len + mask_len tokens
    tokens: tuple[int, ...]  # the sequence up to the first mask: prompt and committed blocks
    forwards: int = 0  # planned forwards of this block; 0: the sampler decides
    sampling: Sampling = Sampling()


@dataclass(frozen=True, slots=True)
class TransferOrder:
    """One end's part of one attempt of a KV transfer (or the source's release once it is over)."""

    kind: TransferKind
    transfer_id: int
    attempt: int  # 1, 2, ...
    request_id: int
    block: int
    peer: int  # the other end: destination of a SEND, source of a RECEIVE
    pages: int  # KV pages of the request
    generation: int = 0  # of the pair's process group: raised after a failed attempt
    tag: int = 0  # one per attempt
    work: BlockWork | None = None  # RECEIVE: the block to decode once its KV is in place
    block_tokens: tuple[int, ...] = ()  # RECEIVE: the block's 32 ids after the prefill's unmasking
    step: int = 0  # RECEIVE: forwards the block has had (1: its prefill)
    block_logprobs: Logprobs | None = None  # RECEIVE, if asked: `Prefilled.block_logprobs`


@dataclass(frozen=True, slots=True)
class DropOrder:
    """Forget a request on this worker: its queued or running block, its KV pages and its ends of KV
    transfers. The worker applies it at its next iteration (never to pages a forward in flight uses), to
    the work of earlier Enqueue calls only: the scheduler has sent the request elsewhere (a lost worker),
    or ended it (a failure, a client's cancel)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class WorkBatch:
    """What one Enqueue call carries, applied in this order: drops (of earlier calls' work), blocks to
    prefill, then transfer orders in the order issued."""

    blocks: tuple[BlockWork, ...] = ()
    orders: tuple[TransferOrder, ...] = ()
    drops: tuple[DropOrder, ...] = ()
