from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATUS_UNSPECIFIED: _ClassVar[RequestStatus]
    QUEUED: _ClassVar[RequestStatus]
    RUNNING: _ClassVar[RequestStatus]
    DONE: _ClassVar[RequestStatus]
    ERROR: _ClassVar[RequestStatus]
    NOT_FOUND: _ClassVar[RequestStatus]

class TransferKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEND: _ClassVar[TransferKind]
    RECEIVE: _ClassVar[TransferKind]
    RELEASE: _ClassVar[TransferKind]

class ItemKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFILL: _ClassVar[ItemKind]
    DECODE: _ClassVar[ItemKind]

REQUEST_STATUS_UNSPECIFIED: RequestStatus
QUEUED: RequestStatus
RUNNING: RequestStatus
DONE: RequestStatus
ERROR: RequestStatus
NOT_FOUND: RequestStatus
SEND: TransferKind
RECEIVE: TransferKind
RELEASE: TransferKind
PREFILL: ItemKind
DECODE: ItemKind

class SamplingParams(_message.Message):
    __slots__ = ("threshold", "temperature", "seed", "logprobs")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    temperature: float
    seed: int
    logprobs: int
    def __init__(
        self,
        threshold: _Optional[float] = ...,
        temperature: _Optional[float] = ...,
        seed: _Optional[int] = ...,
        logprobs: _Optional[int] = ...,
    ) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("token", "top", "top_ids", "top_logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: _containers.RepeatedScalarFieldContainer[float]
    top: int
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(
        self,
        token: _Optional[_Iterable[float]] = ...,
        top: _Optional[int] = ...,
        top_ids: _Optional[_Iterable[int]] = ...,
        top_logprobs: _Optional[_Iterable[float]] = ...,
    ) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("prompt_token_ids", "gen_len", "sampling", "forwards", "watch", "mask_len")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GEN_LEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    WATCH_FIELD_NUMBER: _ClassVar[int]
    MASK_LEN_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    gen_len: int
    sampling: SamplingParams
    forwards: _containers.RepeatedScalarFieldContainer[int]
    watch: bool
    mask_len: int
    def __init__(
        self,
        prompt_token_ids: _Optional[_Iterable[int]] = ...,
        gen_len: _Optional[int] = ...,
        sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...,
        forwards: _Optional[_Iterable[int]] = ...,
        watch: _Optional[bool] = ...,
        mask_len: _Optional[int] = ...,
    ) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("request_id", "status", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: RequestStatus
    error: str
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        status: _Optional[_Union[RequestStatus, str]] = ...,
        error: _Optional[str] = ...,
    ) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class RequestState(_message.Message):
    __slots__ = (
        "request_id",
        "status",
        "error",
        "token_ids",
        "blocks_done",
        "n_blocks",
        "eos",
        "arrival",
        "end",
        "forwards",
        "queue_s",
        "prefill_s",
        "decode_s",
        "transfer_s",
        "overflow_blocks",
        "logprobs",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_DONE_FIELD_NUMBER: _ClassVar[int]
    N_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EOS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: RequestStatus
    error: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    blocks_done: int
    n_blocks: int
    eos: bool
    arrival: float
    end: float
    forwards: _containers.RepeatedScalarFieldContainer[int]
    queue_s: float
    prefill_s: float
    decode_s: float
    transfer_s: _containers.RepeatedScalarFieldContainer[float]
    overflow_blocks: int
    logprobs: Logprobs
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        status: _Optional[_Union[RequestStatus, str]] = ...,
        error: _Optional[str] = ...,
        token_ids: _Optional[_Iterable[int]] = ...,
        blocks_done: _Optional[int] = ...,
        n_blocks: _Optional[int] = ...,
        eos: _Optional[bool] = ...,
        arrival: _Optional[float] = ...,
        end: _Optional[float] = ...,
        forwards: _Optional[_Iterable[int]] = ...,
        queue_s: _Optional[float] = ...,
        prefill_s: _Optional[float] = ...,
        decode_s: _Optional[float] = ...,
        transfer_s: _Optional[_Iterable[float]] = ...,
        overflow_blocks: _Optional[int] = ...,
        logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...,
    ) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("tag", "submit")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    tag: int
    submit: SubmitRequest
    def __init__(
        self, tag: _Optional[int] = ..., submit: _Optional[_Union[SubmitRequest, _Mapping]] = ...
    ) -> None: ...

class Submitted(_message.Message):
    __slots__ = ("tag", "reply", "unavailable")
    TAG_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    reply: SubmitReply
    unavailable: str
    def __init__(
        self,
        tag: _Optional[int] = ...,
        reply: _Optional[_Union[SubmitReply, _Mapping]] = ...,
        unavailable: _Optional[str] = ...,
    ) -> None: ...

class StateBatch(_message.Message):
    __slots__ = ("states", "submitted")
    STATES_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[RequestState]
    submitted: _containers.RepeatedCompositeFieldContainer[Submitted]
    def __init__(
        self,
        states: _Optional[_Iterable[_Union[RequestState, _Mapping]]] = ...,
        submitted: _Optional[_Iterable[_Union[Submitted, _Mapping]]] = ...,
    ) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = (
        "ready",
        "workers_expected",
        "workers_registered",
        "submitted",
        "done",
        "errors",
        "iterations",
        "failure",
        "vocab",
        "mask_id",
        "mask_len",
        "pages",
        "eos_ids",
        "model",
        "layout",
        "workers",
        "transfers_done",
        "transfers_failed",
        "transfer_retries",
        "transfers_in_flight",
        "first_arrival",
        "workers_lost",
        "requests_recovered",
        "forwards_redone",
        "requests_failed",
        "context_len",
    )
    READY_FIELD_NUMBER: _ClassVar[int]
    WORKERS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FIELD_NUMBER: _ClassVar[int]
    MASK_ID_FIELD_NUMBER: _ClassVar[int]
    MASK_LEN_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    EOS_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_DONE_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_RETRIES_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    FIRST_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    WORKERS_LOST_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_REDONE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FAILED_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    workers_expected: int
    workers_registered: int
    submitted: int
    done: int
    errors: int
    iterations: int
    failure: str
    vocab: int
    mask_id: int
    mask_len: int
    pages: int
    eos_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    layout: str
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    transfers_done: int
    transfers_failed: int
    transfer_retries: int
    transfers_in_flight: int
    first_arrival: float
    workers_lost: int
    requests_recovered: int
    forwards_redone: int
    requests_failed: int
    context_len: int
    def __init__(
        self,
        ready: _Optional[bool] = ...,
        workers_expected: _Optional[int] = ...,
        workers_registered: _Optional[int] = ...,
        submitted: _Optional[int] = ...,
        done: _Optional[int] = ...,
        errors: _Optional[int] = ...,
        iterations: _Optional[int] = ...,
        failure: _Optional[str] = ...,
        vocab: _Optional[int] = ...,
        mask_id: _Optional[int] = ...,
        mask_len: _Optional[int] = ...,
        pages: _Optional[int] = ...,
        eos_ids: _Optional[_Iterable[int]] = ...,
        model: _Optional[str] = ...,
        layout: _Optional[str] = ...,
        workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...,
        transfers_done: _Optional[int] = ...,
        transfers_failed: _Optional[int] = ...,
        transfer_retries: _Optional[int] = ...,
        transfers_in_flight: _Optional[int] = ...,
        first_arrival: _Optional[float] = ...,
        workers_lost: _Optional[int] = ...,
        requests_recovered: _Optional[int] = ...,
        forwards_redone: _Optional[int] = ...,
        requests_failed: _Optional[int] = ...,
        context_len: _Optional[int] = ...,
    ) -> None: ...

class WorkerState(_message.Message):
    __slots__ = (
        "worker_id",
        "role",
        "pages",
        "free_pages",
        "router_free",
        "outstanding",
        "lost",
        "pid",
        "device",
        "lost_reason",
        "forwards_at_risk",
    )
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    ROUTER_FREE_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LOST_REASON_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_AT_RISK_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    role: str
    pages: int
    free_pages: int
    router_free: int
    outstanding: int
    lost: bool
    pid: int
    device: str
    lost_reason: str
    forwards_at_risk: int
    def __init__(
        self,
        worker_id: _Optional[int] = ...,
        role: _Optional[str] = ...,
        pages: _Optional[int] = ...,
        free_pages: _Optional[int] = ...,
        router_free: _Optional[int] = ...,
        outstanding: _Optional[int] = ...,
        lost: _Optional[bool] = ...,
        pid: _Optional[int] = ...,
        device: _Optional[str] = ...,
        lost_reason: _Optional[str] = ...,
        forwards_at_risk: _Optional[int] = ...,
    ) -> None: ...

class ResultsRequest(_message.Message):
    __slots__ = ("first",)
    FIRST_FIELD_NUMBER: _ClassVar[int]
    first: int
    def __init__(self, first: _Optional[int] = ...) -> None: ...

class BlockTimes(_message.Message):
    __slots__ = (
        "ready",
        "dispatch",
        "prefill_worker",
        "overflow",
        "prefill_start",
        "prefill_end",
        "transfer_start",
        "transfer_end",
        "decode_worker",
        "decode_start",
        "end",
    )
    READY_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    PREFILL_START_FIELD_NUMBER: _ClassVar[int]
    PREFILL_END_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_START_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_END_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    DECODE_START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ready: float
    dispatch: float
    prefill_worker: int
    overflow: bool
    prefill_start: float
    prefill_end: float
    transfer_start: float
    transfer_end: float
    decode_worker: int
    decode_start: float
    end: float
    def __init__(
        self,
        ready: _Optional[float] = ...,
        dispatch: _Optional[float] = ...,
        prefill_worker: _Optional[int] = ...,
        overflow: _Optional[bool] = ...,
        prefill_start: _Optional[float] = ...,
        prefill_end: _Optional[float] = ...,
        transfer_start: _Optional[float] = ...,
        transfer_end: _Optional[float] = ...,
        decode_worker: _Optional[int] = ...,
        decode_start: _Optional[float] = ...,
        end: _Optional[float] = ...,
    ) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("request_id", "arrival", "prompt_len", "output_len", "mask_len", "forwards", "blocks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    MASK_LEN_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    arrival: float
    prompt_len: int
    output_len: int
    mask_len: int
    forwards: _containers.RepeatedScalarFieldContainer[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockTimes]
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        arrival: _Optional[float] = ...,
        prompt_len: _Optional[int] = ...,
        output_len: _Optional[int] = ...,
        mask_len: _Optional[int] = ...,
        forwards: _Optional[_Iterable[int]] = ...,
        blocks: _Optional[_Iterable[_Union[BlockTimes, _Mapping]]] = ...,
    ) -> None: ...

class ResultsReply(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RequestRecord]
    def __init__(self, requests: _Optional[_Iterable[_Union[RequestRecord, _Mapping]]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShutdownReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = (
        "worker_id",
        "address",
        "pages",
        "vocab",
        "mask_id",
        "eos_ids",
        "model",
        "device",
        "pid",
        "role",
        "context_len",
    )
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FIELD_NUMBER: _ClassVar[int]
    MASK_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    address: str
    pages: int
    vocab: int
    mask_id: int
    eos_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    device: str
    pid: int
    role: str
    context_len: int
    def __init__(
        self,
        worker_id: _Optional[int] = ...,
        address: _Optional[str] = ...,
        pages: _Optional[int] = ...,
        vocab: _Optional[int] = ...,
        mask_id: _Optional[int] = ...,
        eos_ids: _Optional[_Iterable[int]] = ...,
        model: _Optional[str] = ...,
        device: _Optional[str] = ...,
        pid: _Optional[int] = ...,
        role: _Optional[str] = ...,
        context_len: _Optional[int] = ...,
    ) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("accepted", "error", "incarnation")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    error: str
    incarnation: int
    def __init__(
        self, accepted: _Optional[bool] = ..., error: _Optional[str] = ..., incarnation: _Optional[int] = ...
    ) -> None: ...

class WorkerExit(_message.Message):
    __slots__ = ("worker_id", "pid", "reason", "final")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    pid: int
    reason: str
    final: bool
    def __init__(
        self,
        worker_id: _Optional[int] = ...,
        pid: _Optional[int] = ...,
        reason: _Optional[str] = ...,
        final: _Optional[bool] = ...,
    ) -> None: ...

class BlockWork(_message.Message):
    __slots__ = ("request_id", "arrival", "block", "prompt_len", "mask_len", "tokens", "forwards", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    MASK_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    arrival: float
    block: int
    prompt_len: int
    mask_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    forwards: int
    sampling: SamplingParams
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        arrival: _Optional[float] = ...,
        block: _Optional[int] = ...,
        prompt_len: _Optional[int] = ...,
        mask_len: _Optional[int] = ...,
        tokens: _Optional[_Iterable[int]] = ...,
        forwards: _Optional[int] = ...,
        sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...,
    ) -> None: ...

class EnqueueBatch(_message.Message):
    __slots__ = ("blocks", "transfers", "drops")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockWork]
    transfers: _containers.RepeatedCompositeFieldContainer[TransferOrder]
    drops: _containers.RepeatedCompositeFieldContainer[DropOrder]
    def __init__(
        self,
        blocks: _Optional[_Iterable[_Union[BlockWork, _Mapping]]] = ...,
        transfers: _Optional[_Iterable[_Union[TransferOrder, _Mapping]]] = ...,
        drops: _Optional[_Iterable[_Union[DropOrder, _Mapping]]] = ...,
    ) -> None: ...

class DropOrder(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class TransferOrder(_message.Message):
    __slots__ = (
        "kind",
        "transfer_id",
        "attempt",
        "request_id",
        "block",
        "peer",
        "generation",
        "tag",
        "pages",
        "work",
        "block_tokens",
        "step",
        "block_logprobs",
    )
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    kind: TransferKind
    transfer_id: int
    attempt: int
    request_id: int
    block: int
    peer: int
    generation: int
    tag: int
    pages: int
    work: BlockWork
    block_tokens: _containers.RepeatedScalarFieldContainer[int]
    step: int
    block_logprobs: Logprobs
    def __init__(
        self,
        kind: _Optional[_Union[TransferKind, str]] = ...,
        transfer_id: _Optional[int] = ...,
        attempt: _Optional[int] = ...,
        request_id: _Optional[int] = ...,
        block: _Optional[int] = ...,
        peer: _Optional[int] = ...,
        generation: _Optional[int] = ...,
        tag: _Optional[int] = ...,
        pages: _Optional[int] = ...,
        work: _Optional[_Union[BlockWork, _Mapping]] = ...,
        block_tokens: _Optional[_Iterable[int]] = ...,
        step: _Optional[int] = ...,
        block_logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...,
    ) -> None: ...

class TransferEvent(_message.Message):
    __slots__ = ("kind", "transfer_id", "attempt", "ok", "error", "start", "end", "bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: TransferKind
    transfer_id: int
    attempt: int
    ok: bool
    error: str
    start: float
    end: float
    bytes: int
    def __init__(
        self,
        kind: _Optional[_Union[TransferKind, str]] = ...,
        transfer_id: _Optional[int] = ...,
        attempt: _Optional[int] = ...,
        ok: _Optional[bool] = ...,
        error: _Optional[str] = ...,
        start: _Optional[float] = ...,
        end: _Optional[float] = ...,
        bytes: _Optional[int] = ...,
    ) -> None: ...

class EnqueueReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class ItemShape(_message.Message):
    __slots__ = ("kind", "query_tokens", "context_len")
    KIND_FIELD_NUMBER: _ClassVar[int]
    QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    kind: ItemKind
    query_tokens: int
    context_len: int
    def __init__(
        self,
        kind: _Optional[_Union[ItemKind, str]] = ...,
        query_tokens: _Optional[int] = ...,
        context_len: _Optional[int] = ...,
    ) -> None: ...

class IterationStats(_message.Message):
    __slots__ = (
        "worker",
        "start",
        "end",
        "n_decodes",
        "decode_tokens",
        "n_prefills",
        "prefill_tokens",
        "waiting_prefills",
        "deficit_before",
        "budget",
        "deficit_after",
        "memory_blocked",
    )
    WORKER_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    N_DECODES_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAITING_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    DEFICIT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEFICIT_AFTER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BLOCKED_FIELD_NUMBER: _ClassVar[int]
    worker: int
    start: float
    end: float
    n_decodes: int
    decode_tokens: int
    n_prefills: int
    prefill_tokens: int
    waiting_prefills: int
    deficit_before: int
    budget: float
    deficit_after: int
    memory_blocked: int
    def __init__(
        self,
        worker: _Optional[int] = ...,
        start: _Optional[float] = ...,
        end: _Optional[float] = ...,
        n_decodes: _Optional[int] = ...,
        decode_tokens: _Optional[int] = ...,
        n_prefills: _Optional[int] = ...,
        prefill_tokens: _Optional[int] = ...,
        waiting_prefills: _Optional[int] = ...,
        deficit_before: _Optional[int] = ...,
        budget: _Optional[float] = ...,
        deficit_after: _Optional[int] = ...,
        memory_blocked: _Optional[int] = ...,
    ) -> None: ...

class Prefilled(_message.Message):
    __slots__ = (
        "request_id",
        "block",
        "prefill_start",
        "prefill_end",
        "handoff",
        "block_tokens",
        "block_logprobs",
    )
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    PREFILL_START_FIELD_NUMBER: _ClassVar[int]
    PREFILL_END_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    block: int
    prefill_start: float
    prefill_end: float
    handoff: bool
    block_tokens: _containers.RepeatedScalarFieldContainer[int]
    block_logprobs: Logprobs
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        block: _Optional[int] = ...,
        prefill_start: _Optional[float] = ...,
        prefill_end: _Optional[float] = ...,
        handoff: _Optional[bool] = ...,
        block_tokens: _Optional[_Iterable[int]] = ...,
        block_logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...,
    ) -> None: ...

class BlockDone(_message.Message):
    __slots__ = ("request_id", "block", "tokens", "forwards", "decode_start", "end", "eos", "logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    block: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    forwards: int
    decode_start: float
    end: float
    eos: bool
    logprobs: Logprobs
    def __init__(
        self,
        request_id: _Optional[int] = ...,
        block: _Optional[int] = ...,
        tokens: _Optional[_Iterable[int]] = ...,
        forwards: _Optional[int] = ...,
        decode_start: _Optional[float] = ...,
        end: _Optional[float] = ...,
        eos: _Optional[bool] = ...,
        logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...,
    ) -> None: ...

class IterationReport(_message.Message):
    __slots__ = ("stats", "gpu_s", "items", "prefilled", "finished", "cycle_s", "decoded")
    STATS_FIELD_NUMBER: _ClassVar[int]
    GPU_S_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PREFILLED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    CYCLE_S_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    stats: IterationStats
    gpu_s: float
    items: _containers.RepeatedCompositeFieldContainer[ItemShape]
    prefilled: _containers.RepeatedCompositeFieldContainer[Prefilled]
    finished: _containers.RepeatedCompositeFieldContainer[BlockDone]
    cycle_s: float
    decoded: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        stats: _Optional[_Union[IterationStats, _Mapping]] = ...,
        gpu_s: _Optional[float] = ...,
        items: _Optional[_Iterable[_Union[ItemShape, _Mapping]]] = ...,
        prefilled: _Optional[_Iterable[_Union[Prefilled, _Mapping]]] = ...,
        finished: _Optional[_Iterable[_Union[BlockDone, _Mapping]]] = ...,
        cycle_s: _Optional[float] = ...,
        decoded: _Optional[_Iterable[int]] = ...,
    ) -> None: ...

class ReportBatch(_message.Message):
    __slots__ = ("worker_id", "iterations", "transfers", "free_pages", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    iterations: _containers.RepeatedCompositeFieldContainer[IterationReport]
    transfers: _containers.RepeatedCompositeFieldContainer[TransferEvent]
    free_pages: int
    incarnation: int
    def __init__(
        self,
        worker_id: _Optional[int] = ...,
        iterations: _Optional[_Iterable[_Union[IterationReport, _Mapping]]] = ...,
        transfers: _Optional[_Iterable[_Union[TransferEvent, _Mapping]]] = ...,
        free_pages: _Optional[int] = ...,
        incarnation: _Optional[int] = ...,
    ) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
