"""The client's side of the codec: what the scheduler encodes, a client decodes to the same typed value."""

from __future__ import annotations

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
    WorkerState,
)
from sangam.results import RecoveryCounts

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
    assert codec.submission_from_pb(codec.submission_to_pb(sub)) == sub


@given(
    st.builds(
        RequestState, ids, st.sampled_from(RequestStatus), text, tokens, small, small, st.booleans(), times,
        times, tokens, times, times, times, st.lists(times, max_size=3).map(tuple), small,
    )
)  # fmt: skip
def test_a_request_state_round_trips(state: RequestState) -> None:
    assert codec.state_from_pb(codec.state_to_pb(state)) == state
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
    assert codec.status_from_pb(codec.status_to_pb(status)) == status


def test_a_status_compares_equal_to_its_protobuf_name() -> None:
    assert RequestStatus.DONE == "DONE" and RequestStatus.NOT_FOUND == "NOT_FOUND"
    assert RequestState(1, RequestStatus.NOT_FOUND).finished
    assert not RequestState(1, RequestStatus.RUNNING).finished
