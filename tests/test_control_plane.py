"""A closed control plane (issue 17, item 5): each attack comes from a second process (tests/attacker.py)
against real scheduler and worker processes on CPU, and is refused; the normal path still works.

One cluster serves the attacks: `1P1D` with an api key, whose first request (id 0) stalls in its KV
transfer for the whole module (its workers are not declared lost meanwhile), so that it stays RUNNING
while streams wait on it and forged reports name it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from live_helpers import REPO_ROOT, connected_ports, listening_ports, replay, subprocess_env, write_trace

from executor.control import auth, rpc, scheduler_service
from executor.control.client import AsyncSangamClient, SangamClient, SangamError
from executor.control.messages import RequestState
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc
from executor.run.launcher import ClusterSpec, LocalCluster, cpu_workers
from executor.run.live_options import API_KEY_ENV, LiveOptions, with_env_api_key

pytestmark = pytest.mark.timeout(120)

KEY = "test-key-0123"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
ATTACKER = REPO_ROOT / "tests" / "attacker.py"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        cpu_workers(2), mode="1P1D", mask_len=64, pages=128, api_key=KEY, transfer_timeout=600.0,
        transfer_attempts=1, fault_stall_recv=0, worker_timeout=600.0,
    )  # fmt: skip
    with LocalCluster(spec) as started:
        started.start(timeout=60)
        assert started.client is not None
        assert started.client.submit(list(range(1, 25)), 64, forwards=[3, 2]) == 0  # held in its transfer
        yield started
    started.remove_logs()


def addresses(cluster: LocalCluster) -> dict[str, str]:
    """The client port, the control port and each worker's port."""
    info = json.loads((cluster.log_dir / "scheduler.json").read_text())
    out = {"client": cluster.address, "control": info["control"]}
    scheduler = cluster.children[0].proc.pid
    for child in cluster.children[1:]:  # its gRPC port is the one the scheduler is connected to
        (port,) = listening_ports(child.proc.pid) & connected_ports(scheduler)
        out[child.name] = f"127.0.0.1:{port}"
    return out


def attack(calls: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Make `calls` from a second process; their outcomes."""
    done = subprocess.run(
        [sys.executable, str(ATTACKER), "calls"], input=json.dumps(calls), capture_output=True, text=True,
        env=subprocess_env(), timeout=60, check=True,
    )  # fmt: skip
    outcomes: list[dict[str, str]] = json.loads(done.stdout)
    return outcomes


def raw(
    address: str, method: str, message: Any = None, token: str | None = None, **extra: Any
) -> dict[str, Any]:
    payload = message.SerializeToString().hex() if message is not None else ""
    return {"address": address, "method": method, "payload": payload, "token": token, **extra}


def scheduler_method(name: str) -> str:
    return auth.method("Scheduler", name)


CLIENT_CALLS = {
    "Submit": pb.SubmitRequest(prompt_token_ids=[1, 2, 3], gen_len=32),
    "Poll": pb.RequestRef(request_id=0),
    "Status": pb.StatusRequest(),
    "Results": pb.ResultsRequest(),
    "Shutdown": pb.ShutdownRequest(),
}


def test_every_client_call_needs_the_api_key_but_health_stays_open(cluster: LocalCluster) -> None:
    client = addresses(cluster)["client"]
    calls = []
    for token in (None, "wrong-key", cluster.secret + "x"):
        calls += [raw(client, scheduler_method(name), msg, token) for name, msg in CLIENT_CALLS.items()]
        calls.append(raw(client, scheduler_method("Stream"), pb.RequestRef(request_id=0), token, stream=True))
        calls.append(raw(client, scheduler_method("Watch"), pb.WatchRequest(), token, stream=True))
    calls.append(raw(client, HEALTH_CHECK, None))
    calls.append(raw(client, scheduler_method("Status"), pb.StatusRequest(), KEY))
    outcomes = attack(calls)
    assert [o["code"] for o in outcomes[:-2]] == ["UNAUTHENTICATED"] * 21
    assert "authorization: Bearer" in outcomes[0]["details"]
    assert [o["code"] for o in outcomes[-2:]] == ["OK", "OK"]  # health and a call with the key
    status = cluster.client.status() if cluster.client else None
    assert status is not None and status.ready and status.submitted == 1  # no Submit got through
    log = (cluster.log_dir / "scheduler.log").read_text()
    assert log.count("scheduler client port refused") == 21


def test_the_client_sends_its_api_key(cluster: LocalCluster) -> None:
    with SangamClient(cluster.address, api_key=KEY) as client:
        assert client.status().ready
        assert client.poll(0).status == "RUNNING"
    with SangamClient(cluster.address) as client, pytest.raises(SangamError, match="UNAUTHENTICATED"):
        client.status()
    with SangamClient(cluster.address, api_key="wrong") as client, pytest.raises(SangamError, match="UNAUTH"):
        client.shutdown()


def test_no_secret_no_control_plane_calls(cluster: LocalCluster) -> None:
    """Forged registration, a forged report naming the held request DONE, and Shutdown or Enqueue on a
    worker: without the run's secret every one is refused, and the held request stays RUNNING."""
    where = addresses(cluster)
    register = pb.RegisterRequest(worker_id=1, address="127.0.0.1:9", pages=9999, vocab=300, mask_id=299,
                                  role="decode")  # fmt: skip
    report = pb.ReportBatch(worker_id=7)
    report.iterations.add().finished.add(request_id=0, block=1, tokens=[5] * 32, forwards=1, end=1.0)
    enqueue = pb.EnqueueBatch()
    enqueue.blocks.add(request_id=50, block=0, prompt_len=3, mask_len=64, tokens=[1, 2, 3], forwards=1)
    calls = []
    for token in (None, KEY, "0" * 64):  # no credential, the api key, a guess
        calls += [
            raw(where["control"], auth.method("Control", "Register"), register, token),
            raw(where["control"], auth.method("Control", "Report"), report, token),
        ]
        for worker in ("worker 0", "worker 1"):
            calls += [
                raw(where[worker], auth.method("Worker", "Enqueue"), enqueue, token),
                raw(where[worker], auth.method("Worker", "Shutdown"), pb.ShutdownRequest(), token),
            ]
    calls += [raw(where[w], HEALTH_CHECK) for w in ("worker 0", "worker 1")]
    outcomes = attack(calls)
    assert [o["code"] for o in outcomes[:-2]] == ["UNAUTHENTICATED"] * 18
    assert [o["code"] for o in outcomes[-2:]] == ["OK", "OK"]
    assert cluster.client is not None
    status = cluster.client.status()
    assert status.ready and not status.failure and status.workers_registered == 2
    assert cluster.client.poll(0).status == "RUNNING"
    assert all(child.proc.poll() is None for child in cluster.children)
    logs = {c.name: c.log_path.read_text() for c in cluster.children}
    assert logs["scheduler"].count("scheduler control port refused") == 6
    assert logs["worker 0"].count("worker 0 refused") == 6 and logs["worker 1"].count("worker 1 refused") == 6


GARBAGE = b"\xff" * 12  # a varint longer than protobuf allows


def test_undecodable_requests_get_invalid_argument_and_no_traceback(cluster: LocalCluster) -> None:
    where = addresses(cluster)
    calls = [raw(where["client"], m, None, KEY) for m in auth.methods("Scheduler")]
    calls += [raw(where["control"], m, None, cluster.secret) for m in auth.methods("Control")]
    for worker in ("worker 0", "worker 1"):
        calls += [raw(where[worker], m, None, cluster.secret) for m in auth.methods("Worker")]
    calls += [raw(where[name], HEALTH_CHECK) for name in ("client", "worker 0", "worker 1")]
    for call in calls:
        call["payload"] = GARBAGE.hex()
        call["stream"] = call["method"].endswith(("/Stream", "/Watch"))
    outcomes = attack(calls)
    assert [o["code"] for o in outcomes] == ["INVALID_ARGUMENT"] * len(calls)
    assert "does not decode" in outcomes[0]["details"]
    assert cluster.client is not None and cluster.client.status().ready
    for child in cluster.children:
        text = child.log_path.read_text()
        assert "Traceback" not in text and "undecodable" in text, child.name


def test_without_an_api_key_the_client_port_is_open_but_its_shutdown_needs_the_secret() -> None:
    spec = ClusterSpec(cpu_workers(1), mask_len=64, pages=64)
    with LocalCluster(spec) as open_cluster:
        open_cluster.start(timeout=60)
        address = open_cluster.address
        shutdown = scheduler_method("Shutdown")
        calls = [raw(address, scheduler_method("Status"), pb.StatusRequest())]
        calls += [raw(address, shutdown, pb.ShutdownRequest(), token) for token in (None, "guess")]
        outcomes = attack(calls)
        assert [o["code"] for o in outcomes] == ["OK", "UNAUTHENTICATED", "UNAUTHENTICATED"]
        assert open_cluster.client is not None
        rid = open_cluster.client.submit([1, 2, 3], 32, forwards=[2])
        assert open_cluster.client.wait(rid, timeout=30).status == "DONE"
        scheduler_proc = open_cluster.children[0].proc
        open_cluster.client.shutdown()  # the launcher's client presents the secret
        assert scheduler_proc.wait(timeout=15) == 0
    open_cluster.remove_logs()


def test_the_secret_reaches_the_children_only_through_stdin(cluster: LocalCluster) -> None:
    for child in cluster.children:
        cmdline = Path(f"/proc/{child.proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{child.proc.pid}/environ").read_bytes()
        assert cluster.secret.encode() not in cmdline + environ and KEY.encode() not in cmdline + environ
    assert all(cluster.secret not in p.read_text() for p in cluster.log_dir.iterdir())


def test_api_key_from_the_environment_when_the_flag_is_absent() -> None:
    assert with_env_api_key(LiveOptions(), {API_KEY_ENV: "k1"}).api_key == "k1"
    assert with_env_api_key(LiveOptions(api_key="k2"), {API_KEY_ENV: "k1"}).api_key == "k2"
    assert with_env_api_key(LiveOptions(), {}).api_key is None
    assert with_env_api_key(LiveOptions(), {API_KEY_ENV: ""}).api_key is None
    with pytest.raises(ValueError, match="must not be empty"):
        with_env_api_key(LiveOptions(api_key=""), {})


def test_a_replay_with_an_api_key_completes(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.csv", 6, qps=20.0, prompt=(4, 20), output=(1, 64), seed=2)
    out = tmp_path / "out"
    argv = ["--workers", "1", "--trace", str(trace), "--mask-len", "64", "--progress", "uniform:1:3",
            "--out", str(out), "--api-key", KEY]  # fmt: skip
    replay(argv)
    assert json.loads((out / "summary.json").read_text())["completed"] == 6


def test_sangam_live_help_documents_the_api_key() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "live", "--help"], capture_output=True, text=True,
        env={**subprocess_env(), "COLUMNS": "200", API_KEY_ENV: "must-not-show"}, check=True,
    )  # fmt: skip
    text = " ".join(done.stdout.split())
    assert "--api-key KEY" in text and f"${API_KEY_ENV}" in text and "authorization: Bearer KEY" in text
    assert "must-not-show" not in text


def hold_streams(address: str, count: int, connections: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A second process holding `count` Streams of the held request open; what the server did at once."""
    proc = subprocess.Popen(
        [sys.executable, str(ATTACKER), "streams"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=subprocess_env(),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    spec = raw(address, scheduler_method("Stream"), pb.RequestRef(request_id=0), KEY)
    proc.stdin.write(json.dumps({**spec, "count": count, "connections": connections}) + "\n")
    proc.stdin.flush()
    return proc, json.loads(proc.stdout.readline())


async def first_async_update(address: str) -> RequestState:
    client = AsyncSangamClient(address, api_key=KEY)
    updates = client.stream(0)
    try:
        return await anext(updates)
    finally:
        await updates.aclose()
        await client.close()


def test_open_streams_never_starve_submit_status_and_health(cluster: LocalCluster) -> None:
    """300 Streams from one connection, then 200 more from two others: the server keeps 128 per
    connection and 192 in all, refuses the rest (and a Watch) at once with RESOURCE_EXHAUSTED, and Submit,
    Status and health keep answering meanwhile; the clients, refused a stream, poll. Last in this module: the
    server frees a cancelled stream's slot within a second, not at once."""
    one, first = hold_streams(cluster.address, 300, connections=1)
    two, second = hold_streams(cluster.address, 200, connections=2)
    try:
        with SangamClient(cluster.address, api_key=KEY, timeout=5.0) as client:
            for _ in range(20):
                assert client.status().ready
                reply = client.submit_reply([1, 2, 3], 0)  # refused as bad input: nothing runs
                assert reply.status == "ERROR" and "gen" in reply.error
            ch = rpc.channel(cluster.address)
            assert rpc.check_health(ch) is None
            ch.close()
            stub = pb_grpc.SchedulerStub(raw_channel := rpc.channel(cluster.address, KEY))
            with pytest.raises(grpc.RpcError) as refused:
                next(stub.Stream(pb.RequestRef(request_id=0), timeout=5))
            with pytest.raises(grpc.RpcError) as watch_refused:  # a Watch is a stream too
                next(stub.Watch(iter(()), timeout=5))
            raw_channel.close()
            for err in (refused.value, watch_refused.value):
                assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "too many open streams" in (err.details() or "")
            # the clients, refused a stream, poll instead
            assert next(iter(client.stream(0, timeout=5))).status == "RUNNING"
            assert client.wait(10**9, timeout=5).status == "NOT_FOUND"
            assert asyncio.run(first_async_update(cluster.address)).status == "RUNNING"
        assert first == {
            "open": scheduler_service.CLIENT_STREAMS_PER_PEER,
            "ended": {"RESOURCE_EXHAUSTED": 172},
        }
        assert second == {"open": 64, "ended": {"RESOURCE_EXHAUSTED": 136}}
    finally:
        for proc in (one, two):
            proc.communicate(timeout=30)
    assert cluster.client is not None and cluster.client.poll(0).status == "RUNNING"
