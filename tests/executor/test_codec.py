"""The codec: what one process encodes, the other decodes to the same typed value."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.control import codec
from executor.control.messages import (
    ClusterStatus,
    ModelFacts,
    RequestState,
    RequestStatus,
    Sampling,
    Submission,
    WatchBatch,
    WorkerState,
)
from executor.proto import sangam_pb2 as pb
from runs.results import RecoveryCounts

ids = st.integers(0, 2**31 - 1)
small = st.integers(0, 10_000)
times = st.floats(0, 1e6, allow_nan=False)
text = st.text(max_size=40)
tokens = st.lists(st.integers(0, 2**31 - 1), max_size=64).map(tuple)
sampling = st.builds(
    Sampling,
    st.none() | st.floats(0.01, 1.0),
    st.none() | st.floats(0, 2.0),
    st.none() | st.integers(0, 2**62),
)


@given(st.builds(Submission, tokens, small, sampling, tokens))
def test_a_submission_round_trips(sub: Submission) -> None:
    assert codec.from_pb(codec.to_pb(sub), Submission) == sub


@given(
    st.builds(
        RequestState, ids, st.sampled_from(RequestStatus), text, tokens, small, small, st.booleans(), times,
        times, tokens, times, times, times, st.lists(times, max_size=3).map(tuple), small,
    )
)  # fmt: skip
def test_a_request_state_round_trips(state: RequestState) -> None:
    assert codec.from_pb(codec.to_pb(state), RequestState) == state
    reply = codec.submit_reply_from_pb(codec.submit_reply(state))
    assert (reply.request_id, reply.status, reply.error) == (state.request_id, state.status, state.error)


workers = st.lists(st.builds(WorkerState, small, st.sampled_from(["colocated", "prefill"]), small, small,
                             small, small), max_size=4).map(tuple)  # fmt: skip
facts = st.none() | st.builds(ModelFacts, st.integers(1, 10**6), small, tokens, small, text, small)


@given(workers, facts, st.builds(RecoveryCounts, small, small, small, small), small, text)
def test_a_cluster_status_round_trips(
    workers: tuple[WorkerState, ...], facts: ModelFacts | None, recovery: RecoveryCounts, n: int, why: str
) -> None:
    status = ClusterStatus(
        ready=n % 2 == 0, workers_expected=n, workers_registered=n // 2, submitted=n, done=n // 3,
        errors=n // 5, iterations=7 * n, failure=why, mask_len=1024, layout="1P1D", transfers_done=n,
        transfers_failed=1, transfer_retries=2, transfers_in_flight=3, first_arrival=12.5, workers=workers,
        facts=facts, recovery=recovery,
    )  # fmt: skip
    assert codec.from_pb(codec.to_pb(status), ClusterStatus) == status


def test_a_status_compares_equal_to_its_protobuf_name() -> None:
    assert RequestStatus.DONE == "DONE" and RequestStatus.NOT_FOUND == "NOT_FOUND"
    assert RequestState(1, RequestStatus.NOT_FOUND).finished
    assert not RequestState(1, RequestStatus.RUNNING).finished


def values(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a message field's type, in the ranges its protobuf field holds."""
    if (inner := codec._optional(hint)) is not None:
        return st.none() | values(inner)
    if (element := codec._sequence(hint)) is not None:
        container = typing.get_origin(hint)
        return st.lists(values(element), max_size=3).map(container)
    if dataclasses.is_dataclass(hint):
        fields = {name: values(field) for name, field in codec._fields(hint)}
        if hint is ModelFacts:  # sent flat in the status reply, present when its vocab is
            fields["vocab"] = st.integers(1, 2**31 - 1)
        return st.builds(hint, **fields)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from(hint)
    return {int: ids, float: st.floats(allow_nan=False), str: text, bool: st.booleans()}[hint]


ROUND_TRIPS = [kind for kind, wire in codec.WIRE.items() if wire.pb is not None and kind is not WatchBatch]


@pytest.mark.parametrize("kind", ROUND_TRIPS, ids=lambda kind: kind.__name__)
def test_every_message_round_trips_through_its_wire_form(kind: type) -> None:
    @given(values(kind))
    def round_trip(value: Any) -> None:
        assert codec.from_pb(codec.to_pb(value), kind) == value

    round_trip()


def test_an_unknown_enum_value_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown RequestStatus 9"):
        codec.from_pb(pb.RequestState(status=9), RequestState)
    with pytest.raises(ValueError, match="unknown RequestStatus 0"):
        codec.submit_reply_from_pb(pb.SubmitReply())
