"""The one place where the control plane's typed messages (`executor.control.messages`) meet protobuf
(`executor/proto/sangam.proto`).

Each message is defined once, as a dataclass; `WIRE` names its protobuf message and says where the two
differ, and `to_pb` / `from_pb` derive both directions from the dataclass's fields and their types:

- a field goes to the protobuf field of the same name, unless `Wire.names` renames it;
- `int`, `float`, `str`, `bool`: as they are; `X | None`: an `optional` field, unset for None;
- an `Enum`: the protobuf enum value of the same name (an unknown number is a ValueError);
- a nested message, a tuple or a list of them: a sub-message, repeated;
- `Wire.flat`: a nested message whose fields sit in the parent's message (the status reply's facts);
- `Wire.convert`: a pair of functions for a field whose wire form has another shape.

The few protobuf messages of another shape (a Submit's reply, a registration's answer, a finished
request's timing record) and the calls without a payload keep their own functions below.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any, TypeVar

from executor.control.messages import (
    BlockDone,
    BlockWork,
    ClusterStatus,
    DropOrder,
    ItemShape,
    IterationReport,
    IterationStats,
    Logprobs,
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
    TransferOrder,
    WatchBatch,
    WorkBatch,
    WorkerExit,
    WorkerState,
)
from executor.proto import sangam_pb2 as pb
from runs.results import RecoveryCounts
from sangam.request import BlockRecord, Request

T = TypeVar("T")
Message = Any  # a protobuf message (the generated classes carry no usable static type)


@dataclass(frozen=True, slots=True)
class Wire:
    """A typed message's wire form: its protobuf message, and how their fields differ."""

    pb: Any  # the protobuf message class; None: only ever flat inside another message
    names: Mapping[str, str] = field(default_factory=dict)  # field -> protobuf field, where they differ
    # field -> (to the protobuf field's value, from it), where the shapes differ
    convert: Mapping[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = field(default_factory=dict)
    # nested message fields spread into this message -> the protobuf field whose non-zero value says the
    # nested message is there (None: always there)
    flat: Mapping[str, str | None] = field(default_factory=dict)


def _submitted_to_pb(s: Submitted) -> pb.Submitted:
    reply = submit_reply(s.state) if s.state is not None else None
    return pb.Submitted(tag=s.tag, reply=reply, unavailable=s.unavailable)


def _submitted_from_pb(msg: pb.Submitted) -> Submitted:
    return Submitted(msg.tag, None if msg.unavailable else submit_reply_from_pb(msg.reply), msg.unavailable)


WIRE: dict[type, Wire] = {
    # clients <-> scheduler
    Sampling: Wire(pb.SamplingParams),
    Logprobs: Wire(pb.Logprobs),
    Submission: Wire(pb.SubmitRequest, names={"prompt": "prompt_token_ids"}),
    RequestState: Wire(pb.RequestState),
    WatchBatch: Wire(
        pb.StateBatch,
        convert={
            "submitted": (
                lambda items: [_submitted_to_pb(s) for s in items],
                lambda items: [_submitted_from_pb(s) for s in items],
            )
        },
    ),
    WorkerState: Wire(pb.WorkerState),
    ModelFacts: Wire(None),
    RecoveryCounts: Wire(None),
    ClusterStatus: Wire(pb.StatusReply, flat={"facts": "vocab", "recovery": None}),
    # workers -> scheduler
    Registration: Wire(pb.RegisterRequest),
    WorkerExit: Wire(pb.WorkerExit),
    ItemShape: Wire(
        pb.ItemShape,
        names={"prefill": "kind"},
        convert={
            "prefill": (lambda prefill: pb.PREFILL if prefill else pb.DECODE, lambda k: k == pb.PREFILL)
        },
    ),
    IterationStats: Wire(pb.IterationStats),
    Prefilled: Wire(pb.Prefilled),
    BlockDone: Wire(pb.BlockDone),
    IterationReport: Wire(pb.IterationReport),
    TransferEvent: Wire(pb.TransferEvent, names={"nbytes": "bytes"}),
    ReportBatch: Wire(pb.ReportBatch),
    # scheduler -> workers
    BlockWork: Wire(pb.BlockWork),
    TransferOrder: Wire(pb.TransferOrder),
    DropOrder: Wire(pb.DropOrder),
    WorkBatch: Wire(pb.EnqueueBatch, names={"orders": "transfers"}),
}


def to_pb(value: Any) -> Message:
    """The protobuf message of a typed message (`WIRE`)."""
    target = WIRE[type(value)].pb
    assert target is not None, f"{type(value).__name__} is sent only inside another message"
    return target(**_encoder(type(value), target)(value))


def from_pb(msg: Message, kind: type[T]) -> T:
    """The typed message `kind` of a protobuf message; ValueError for an unknown enum value."""
    value: T = _decoder(kind, type(msg))(msg)
    return value


# ---- deriving each direction from the dataclass, once per type -----------------------------------------
#
# Each type's two functions are compiled once from the table, as `dataclasses` compiles `__init__`: one
# expression per field, so a conversion costs what the hand-written pair it replaces did.


def _fields(kind: type) -> list[tuple[str, Any]]:
    """Each field's name and resolved type, in the order of the dataclass's constructor."""
    hints = typing.get_type_hints(kind)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(kind)]


def _optional(hint: Any) -> Any:
    """X of `X | None`, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


def _sequence(hint: Any) -> Any:
    """The element type of `tuple[X, ...]` or `list[X]`, else None."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) in (tuple, list) else None


def _is_message(hint: Any) -> bool:
    return isinstance(hint, type) and hint in WIRE


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Enum)


def _wire_class(kind: type) -> Any:
    cls = WIRE[kind].pb
    assert cls is not None, f"{kind.__name__} is sent only flat inside another message"
    return cls


def _compile(name: str, source: str, env: dict[str, Any]) -> Callable[..., Any]:
    exec(compile(source, f"<codec {name}>", "exec"), env)
    function: Callable[..., Any] = env[name]
    return function


Encoder = Callable[[Any], dict[str, Any]]
Decoder = Callable[[Message], Any]
_encoders: dict[tuple[type, type], Encoder] = {}
_decoders: dict[tuple[type, type], Decoder] = {}


def _encoder(kind: type, target: type) -> Encoder:
    if (kind, target) not in _encoders:
        _encoders[kind, target] = _compile_encoder(kind, target)
    return _encoders[kind, target]


def _decoder(kind: type, source: type) -> Decoder:
    if (kind, source) not in _decoders:
        _decoders[kind, source] = _compile_decoder(kind, source)
    return _decoders[kind, source]


def _compile_encoder(kind: type, target: Any) -> Encoder:
    """The keyword arguments of `target`'s constructor for a `kind` (whose fields land in `target`: its
    wire form, or its parent's when it is flat there); None leaves a field unset."""
    wire = WIRE[kind]
    env: dict[str, Any] = {}
    entries, flats = [], []
    for i, (name, hint) in enumerate(_fields(kind)):
        value, inner = f"value.{name}", _optional(hint)
        if name in wire.flat:
            env[f"flat{i}"] = _encoder(inner or hint, target)
            flats.append(f"    if {value} is not None:\n        kwargs.update(flat{i}({value}))\n")
            continue
        key = wire.names.get(name, name)
        hint = inner or hint
        element = _sequence(hint)
        if name in wire.convert:
            env[f"convert{i}"] = wire.convert[name][0]
            expr = f"convert{i}({value})"
        elif element is not None and _is_message(element):
            env[f"cls{i}"], env[f"encode{i}"] = _wire_class(element), _encoder(element, _wire_class(element))
            expr = f"[cls{i}(**encode{i}(item)) for item in {value}]"
        elif _is_message(hint):
            env[f"cls{i}"], env[f"encode{i}"] = _wire_class(hint), _encoder(hint, _wire_class(hint))
            expr = f"cls{i}(**encode{i}({value}))"
        elif _is_enum(hint):
            enum_type = target.DESCRIPTOR.fields_by_name[key].enum_type
            env[f"numbers{i}"] = {m: enum_type.values_by_name[m.name].number for m in hint}
            expr = f"numbers{i}[{value}]"
        else:  # a scalar, or a sequence of scalars
            expr = value
        if inner is not None and expr != value:
            expr = f"None if {value} is None else {expr}"
        entries.append(f"{key!r}: {expr}")
    body = "".join(f"        {entry},\n" for entry in entries)
    source = f"def encode(value):\n    kwargs = {{\n{body}    }}\n{''.join(flats)}    return kwargs\n"
    return _compile("encode", source, env)


def _compile_decoder(kind: type, source: Any) -> Decoder:
    """Reads a `kind` from a `source` message (its wire form, or its parent's when it is flat there)."""
    wire = WIRE[kind]
    env: dict[str, Any] = {"kind": kind}
    args = []
    for i, (name, hint) in enumerate(_fields(kind)):
        inner = _optional(hint)
        if name in wire.flat:
            env[f"flat{i}"] = _decoder(inner or hint, source)
            present = wire.flat[name]
            args.append(f"flat{i}(msg)" if present is None else f"flat{i}(msg) if msg.{present} else None")
            continue
        key = wire.names.get(name, name)
        field_value = f"msg.{key}"
        hint = inner or hint
        element = _sequence(hint)
        if name in wire.convert:
            env[f"convert{i}"] = wire.convert[name][1]
            expr = f"convert{i}({field_value})"
        elif element is not None and _is_message(element):
            env[f"decode{i}"] = _decoder(element, _wire_class(element))
            container = typing.get_origin(hint).__name__
            expr = f"{container}([decode{i}(item) for item in {field_value}])"
        elif element is not None:
            expr = f"{typing.get_origin(hint).__name__}({field_value})"
        elif _is_message(hint):
            env[f"decode{i}"] = _decoder(hint, _wire_class(hint))
            expr = f"decode{i}({field_value})"
        elif _is_enum(hint):
            values = source.DESCRIPTOR.fields_by_name[key].enum_type.values
            members = {v.number: hint[v.name] for v in values if v.name in hint.__members__}
            env[f"member{i}"] = partial(_member, members, hint.__name__)
            expr = f"member{i}({field_value})"
        else:
            expr = field_value
        if inner is not None:
            expr = f"{expr} if msg.HasField({key!r}) else None"
        args.append(expr)
    body = "".join(f"        {arg},\n" for arg in args)
    return _compile("decode", f"def decode(msg):\n    return kind(\n{body}    )\n", env)


def _member(members: dict[int, Enum], enum: str, number: int) -> Enum:
    member = members.get(number)
    if member is None:
        raise ValueError(f"unknown {enum} {number}")
    return member


# ---- messages of another shape, and calls without a payload ----------------------------------------------


def request_ref(request_id: int) -> pb.RequestRef:
    return pb.RequestRef(request_id=request_id)


def status_request() -> pb.StatusRequest:
    return pb.StatusRequest()


def results_request(first: int = 0) -> pb.ResultsRequest:
    return pb.ResultsRequest(first=first)


def shutdown_request() -> pb.ShutdownRequest:
    return pb.ShutdownRequest()


def watch_submit(tag: int, sub: Submission) -> pb.WatchRequest:
    return pb.WatchRequest(tag=tag, submit=to_pb(sub))


def submit_reply(state: RequestState) -> pb.SubmitReply:
    """A Submit's reply: the request's id, status and error of its first state."""
    status = pb.RequestStatus.Value(state.status.name)
    return pb.SubmitReply(request_id=state.request_id, status=status, error=state.error)


def submit_reply_from_pb(msg: pb.SubmitReply) -> RequestState:
    """The accepted (QUEUED) or refused (ERROR, with the reason) request a Submit reply names."""
    name = pb.RequestStatus.Name(msg.status) if msg.status in pb.RequestStatus.values() else ""
    if name not in RequestStatus.__members__:
        raise ValueError(f"unknown RequestStatus {msg.status}")
    return RequestState(msg.request_id, RequestStatus[name], msg.error)


def empty_status() -> ClusterStatus:
    """The status of a scheduler never heard from: nothing registered, submitted or done."""
    return from_pb(pb.StatusReply(), ClusterStatus)


def register_reply(answer: Registered) -> pb.RegisterReply:
    return pb.RegisterReply(
        accepted=answer.error is None, error=answer.error or "", incarnation=answer.incarnation
    )


def registered_from_pb(msg: pb.RegisterReply) -> Registered:
    return Registered(None if msg.accepted else msg.error, msg.incarnation)


_TIMES = ("dispatch", "prefill_start", "prefill_end", "transfer_start", "transfer_end", "decode_start", "end")
_WORKERS = ("prefill_worker", "decode_worker")


def record_of(req: Request) -> pb.RequestRecord:
    """The timing record of a finished request (runs.results rebuilds its rows from it)."""
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
