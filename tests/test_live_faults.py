"""Lost workers in real `sangam live` runs on CPU (the tiny model): killed, stopped, restarted; and the
abnormal ends that must still write what finished. Each test drives the launcher as a user would, from a
second process, and watches it through the client port."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from live_helpers import descendants, subprocess_env, wait_gone, write_trace

from executor.control import codec, rpc
from executor.control.client import SangamClient, SangamError
from executor.control.messages import BlockDone, IterationReport, IterationStats, ReportBatch
from executor.proto import sangam_pb2_grpc as pb_grpc
from executor.run.launcher import ClusterSpec, LocalCluster, cpu_workers
from executor.run.ports import free_port

pytestmark = pytest.mark.timeout(180)


class Run:
    """A `sangam live` launcher process, its client port, and what it wrote."""

    def __init__(self, proc: subprocess.Popen[str], client: SangamClient, out: Path, logs: Path) -> None:
        self.proc, self.client, self.out, self.logs = proc, client, out, logs

    def status_when(self, ready: Callable[[object], bool], timeout: float = 60.0) -> object:
        """The first status that satisfies `ready` (the run may still be starting)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            try:
                status = self.client.status()
            except SangamError:
                status = None
            if status is not None and ready(status):
                return status
            time.sleep(0.05)
        raise AssertionError(f"no such status within {timeout} s")

    def worker_pid(self, worker: int) -> int:
        status = self.status_when(lambda s: s.ready)
        return int(status.workers[worker].pid)  # type: ignore[attr-defined]

    def finish(self, timeout: float = 240.0) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        return code, self.proc.stderr.read() if self.proc.stderr else ""

    def summary(self) -> dict[str, object]:
        return dict(json.loads((self.out / "summary.json").read_text()))

    def blocks(self) -> list[dict[str, str]]:
        with (self.out / "blocks.csv").open() as f:
            return list(csv.DictReader(f))


@contextmanager
def launched(
    tmp_path: Path, mode: str, workers: int, *extra: str, n: int = 24, qps: float = 8.0
) -> Iterator[Run]:
    """`sangam live` replaying `n` multi-block requests (32 forwards each block) on CPU workers."""
    trace = write_trace(tmp_path / "trace.csv", n, qps=qps, prompt=(4, 40), output=(64, 96), seed=1)
    port, out, logs = free_port(), tmp_path / "out", tmp_path / "logs"
    argv = [
        sys.executable, "-m", "cli.main", "live", "--workers", str(workers), "--mode", mode,
        "--mask-len", "128", "--trace", str(trace), "--num-requests", str(n), "--progress", "fixed:32",
        "--port", str(port), "--out", str(out), "--log-dir", str(logs), *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    client = SangamClient(f"127.0.0.1:{port}", timeout=2.0)
    try:
        yield Run(proc, client, out, logs)
    finally:
        if proc.poll() is None:
            children = descendants(proc.pid)
            proc.kill()
            proc.wait()
            for pid in children:
                os.kill(pid, signal.SIGKILL)
        client.close()


def decoding(w: object) -> bool:
    """The worker reported KV pages in use: blocks it prefilled or received, their forwards reported."""
    return bool(w.free_pages < w.pages)  # type: ignore[attr-defined]


def holding_kv(w: object) -> bool:
    """A prefill worker has prefilled a block whose KV it keeps for a transfer."""
    return bool(w.outstanding == 0 and w.router_free < w.pages)  # type: ignore[attr-defined]


def kill_mid_replay(
    run: Run, worker: int, sig: signal.Signals = signal.SIGKILL, busy: Callable[[object], bool] = decoding
) -> int:
    """Signal `worker`'s process once a few requests are done and it holds work; its pid."""
    pid = run.worker_pid(worker)
    run.status_when(lambda s: s.done >= 2 and busy(s.workers[worker]))  # type: ignore[attr-defined]
    os.kill(pid, sig)
    return pid


def kill_holding_forwards(run: Run, worker: int) -> int:
    """kill -9 `worker` while blocks it has run forwards for are placed on it, once a few requests are
    done; its pid. It is stopped first and judged after its last reports have landed (a stopped worker
    can end nothing), so the blocks the router counts then are exactly those its loss restarts."""
    pid = run.worker_pid(worker)
    while True:
        run.status_when(lambda s: s.done >= 2 and s.workers[worker].forwards_at_risk > 0)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)  # what it sent before it stopped reaches the scheduler
        try:
            held = run.client.status().workers[worker].forwards_at_risk
        except SangamError:
            held = 0  # look again
        if held > 0:
            os.kill(pid, signal.SIGKILL)
            return pid
        os.kill(pid, signal.SIGCONT)


def assert_all_done_after_one_loss(run: Run, n: int = 24) -> dict[str, object]:
    code, err = run.finish()
    assert code == 0, err
    summary = run.summary()
    assert (summary["completed"], summary["failed"], summary["partial"]) == (n, 0, False)
    assert summary["workers_lost"] == 1 and summary["failed"] == 0 and "requests_failed" not in summary
    assert isinstance(summary["forwards_redone"], int) and summary["forwards_redone"] > 0
    assert isinstance(summary["requests_recovered"], int) and summary["requests_recovered"] > 0
    return summary


@pytest.mark.parametrize(
    ("mode", "workers", "victim", "pages", "n"),
    [("2C", 2, 1, 4096, 24), ("2P1C", 3, 1, 40, 48), ("1P2D", 3, 2, 4096, 24)],
)
def test_a_killed_worker_costs_its_blocks_and_every_request_finishes(
    tmp_path: Path, mode: str, workers: int, victim: int, pages: int, n: int
) -> None:
    """kill -9 of a colocated worker, a prefill worker of 2P1C (with KV kept for a transfer: few decode
    pages), a decode worker of 1P2D, each while it holds blocks it has run forwards for: the run goes on
    and every request ends DONE; the blocks it held restarted elsewhere, their forwards done so far
    redone. The prefill worker holds forwards in short spells: its run is twice as long, for more looks
    (24 requests once ended before a look found one, in CI)."""
    with launched(tmp_path, mode, workers, "--pages", str(pages), n=n) as run:
        kill_holding_forwards(run, victim)
        assert_all_done_after_one_loss(run, n)


def test_a_stopped_worker_is_lost_within_the_timeout_and_fenced_after_it_continues(tmp_path: Path) -> None:
    with launched(tmp_path, "2C", 2, "--worker-timeout", "2") as run:
        pid = kill_mid_replay(run, 1, signal.SIGSTOP)
        stopped = time.monotonic()
        run.status_when(lambda s: s.workers[1].lost, timeout=10)  # type: ignore[attr-defined]
        assert time.monotonic() - stopped < 2 + 1.5  # the timeout from its last report, and a check
        run.status_when(lambda s: s.done >= 8)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGCONT)
        assert wait_gone({pid}, 15.0) == set()  # its next report is refused: it stops
        assert_all_done_after_one_loss(run)
    log = (run.logs / "worker-1.log").read_text()
    assert "the scheduler refused this worker's reports" in log and "was declared lost" in log


def test_a_restarted_worker_registers_again_and_takes_work(tmp_path: Path) -> None:
    """With restarts, a killed decode worker of 1P2D gets a new process, which registers under its id,
    builds its KV links afresh (at the generation raised by the loss) and receives KV again: of requests
    submitted after its return, some decode there, and no transfer fails."""
    spec = ClusterSpec(cpu_workers(3), mode="1P2D", mask_len=64, restart_workers=True)
    with LocalCluster(spec, tmp_path / "logs") as cluster:
        cluster.start(timeout=120)
        client = cluster.client
        assert client is not None
        old = client.status().workers[2].pid
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while (w := client.status().workers[2]).pid in (0, old) or w.lost:
            assert time.monotonic() < deadline, "worker 2 did not come back"
            time.sleep(0.1)
        ids = [client.submit(list(range(1, 21)), 64, forwards=[3, 3]) for _ in range(6)]
        assert all(client.wait(rid, timeout=60).status == "DONE" for rid in ids)
        records = {r.id: r for r in client.results()}
        status = client.status()
    assert cluster.exits == [f"worker 2 (pid {old}) was killed by SIGKILL"] and cluster.restarts == 1
    assert {b.decode_worker for rid in ids for b in records[rid].blocks} == {1, 2}
    assert status.recovery.workers_lost == 1 and not any(w.lost for w in status.workers)
    assert (status.transfers_failed, status.transfers_done) == (0, 12)
    assert (tmp_path / "logs" / "worker-2-restart1.log").exists()


def test_worker_0_of_a_hybrid_layout_restarts_under_load_and_moves_kv_again(tmp_path: Path) -> None:
    """kill -9 of worker 0 of 1P1C (the prefill worker) while it holds KV for transfers, with restarts:
    no request is lost (its blocks overflow to worker 1 meanwhile), and the new process registers
    under id 0, rebuilds its links through the launcher's rendezvous store and moves KV again: each
    request submitted after its return prefills on worker 0 and decodes on worker 1."""
    spec = ClusterSpec(cpu_workers(2), mode="1P1C", mask_len=64, restart_workers=True, transfer_timeout=10)
    with LocalCluster(spec, tmp_path / "logs") as cluster:
        cluster.start(timeout=120)
        client = cluster.client
        assert client is not None
        old = client.status().workers[0].pid
        load = [client.submit(list(range(1, 21)), 64, forwards=[8, 8]) for _ in range(8)]
        deadline = time.monotonic() + 60
        while not holding_kv((s := client.status()).workers[0]) or s.transfers_done == 0:
            assert time.monotonic() < deadline, "worker 0 never held KV for a transfer"
            time.sleep(0.01)
        os.kill(old, signal.SIGKILL)
        assert all(client.wait(rid, timeout=60).status == "DONE" for rid in load)
        while (w := client.status().workers[0]).pid in (0, old) or w.lost:
            assert time.monotonic() < deadline + 60, "worker 0 did not come back"
            time.sleep(0.1)
        after = [client.submit(list(range(1, 21)), 64, forwards=[3, 3]) for _ in range(4)]
        assert all(client.wait(rid, timeout=60).status == "DONE" for rid in after)
        records = {r.id: r for r in client.results()}
        status = client.status()
    assert cluster.exits == [f"worker 0 (pid {old}) was killed by SIGKILL"] and cluster.restarts == 1
    placed = {(b.prefill_worker, b.decode_worker) for rid in after for b in records[rid].blocks}
    assert placed == {(0, 1)}
    assert status.recovery.workers_lost == 1 and not any(w.lost for w in status.workers)


def assert_partial(run: Run, err: str, cause: str, line: str | None) -> None:
    """The summary says why the run ended; `line`, if given, is in the one-line error."""
    errors = [x for x in err.splitlines() if x.startswith("sangam: error:")]
    assert "Traceback" not in err and len(errors) == (line is not None)
    assert line is None or line in errors[0]
    summary = run.summary()
    assert summary["partial"] is True and cause in str(summary["partial_cause"])
    finished, failed, unfinished = summary["completed"], summary["failed"], summary["unfinished"]
    assert isinstance(finished, int) and finished >= 2 and finished == summary["finished"]
    assert isinstance(failed, int) and isinstance(unfinished, int) and failed + unfinished > 0
    assert finished + failed + unfinished == 24
    with (run.out / "requests.csv").open() as f:
        assert len(list(csv.DictReader(f))) == finished


def test_losing_the_only_worker_ends_the_run_with_its_cause_and_partial_results(tmp_path: Path) -> None:
    with launched(tmp_path, "1C", 1) as run:
        kill_mid_replay(run, 0)
        code, err = run.finish()
    assert code == 1
    cause = "worker 0 lost (its process was killed by SIGKILL) and 1C has no worker left"
    assert_partial(run, err, cause, cause)


def test_a_killed_scheduler_and_a_sigterm_write_partial_results(tmp_path: Path) -> None:
    for case in ("scheduler", "sigterm"):
        (tmp_path / case).mkdir()
        with launched(tmp_path / case, "1C", 1) as run:
            run.status_when(lambda s: s.done >= 3)  # type: ignore[attr-defined]
            time.sleep(1.1)  # the launcher has fetched the records of the first done
            if case == "sigterm":
                run.proc.send_signal(signal.SIGTERM)
            else:
                (scheduler,) = (
                    p for p in descendants(run.proc.pid)
                    if b"executor.control.scheduler_service" in Path(f"/proc/{p}/cmdline").read_bytes()
                )  # fmt: skip
                os.kill(scheduler, signal.SIGKILL)
            code, err = run.finish()
        if case == "sigterm":
            assert code == 143  # as every sangam command stopped by SIGTERM
            assert_partial(run, err, "interrupted (SIGTERM or Ctrl-C)", None)
        else:
            assert code == 1
            assert_partial(run, err, "scheduler was killed by SIGKILL", "scheduler was killed by SIGKILL")


def test_forged_reports_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """Reports that carry the run's secret (a buggy or compromised holder of it): one naming an unknown
    worker is refused outright; one under a registered worker's id about a request that worker does not
    hold changes nothing."""
    with LocalCluster(ClusterSpec(cpu_workers(2), mask_len=64), tmp_path / "logs") as cluster:
        cluster.start(timeout=120)
        client = cluster.client
        assert client is not None
        rid = client.submit(list(range(1, 21)), 64, forwards=[32, 32])
        holder = -1
        deadline = time.monotonic() + 20
        while holder < 0 and time.monotonic() < deadline:  # its pages are taken while its block runs
            held = [w.worker_id for w in client.status().workers if w.free_pages < w.pages]
            holder = held[0] if held else -1
        assert holder >= 0
        control = pb_grpc.ControlStub(rpc.channel(cluster.control, cluster.secret))
        stats = IterationStats(9, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0)
        forged = IterationReport(stats, 0.0, finished=(BlockDone(rid, 0, (7,) * 32, 1, 0.0),))
        with pytest.raises(grpc.RpcError) as refused:
            control.Report(codec.to_pb(ReportBatch(9, (forged,))), timeout=5)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        control.Report(codec.to_pb(ReportBatch(1 - holder, (forged,))), timeout=5)
        result = client.wait(rid, timeout=60)
        assert result.status == "DONE" and result.token_ids[:32] != (7,) * 32
        after = client.status()
        assert after.done == 1 and [w.outstanding for w in after.workers] == [0, 0]
    cluster.remove_logs()
