"""The processes of a live run: what to launch (`ClusterSpec`), and `LocalCluster`, which starts the
scheduler and the workers, watches them and stops them in order (a Shutdown call, SIGTERM to each process
group, SIGKILL after a timeout). Each child runs in its own session, so a terminal's Ctrl-C reaches only the
launcher, and exits by itself if the launcher disappears; its stderr goes to a log directory kept when
something failed. The launcher makes the run's secret (`executor.control.auth`) and hands it to each
child in its stdin spec, never on the command line or in the environment.

Once the cluster is up, a dead worker does not end the run: a watch thread tells the scheduler
(`Control.WorkerExited`), which recovers the worker's requests, and with `restart_workers` starts a new
process for it on the same device, which registers again and takes work. The KV links' rendezvous store
of a disaggregated or hybrid layout lives here, in the process that outlives every worker: a restarted
worker, worker 0 included, connects to it again and rebuilds its links. A worker the scheduler declared
lost while its process lives on (stopped, hung) is killed first when it is to be restarted, and otherwise
left fenced (it stops once it finds its reports refused). Only the scheduler's exit is fatal.

Imports only the standard library and `sangam` at import time; the client and torch.distributed (for
the rendezvous store) load lazily.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING

from executor.control.process_specs import SchedulerLaunch, WorkerLaunch, encode
from executor.model.live_models import TINY_PAGES
from executor.run.live_options import KV_TRANSPORTS
from sangam.budget import Policy
from sangam.layout import Kind, Layout, parse_mode
from sangam.restarts import RestartPolicy, Restarts

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from executor.control.client import SangamClient
    from executor.control.messages import ClusterStatus

REPO_ROOT = Path(__file__).resolve().parent.parent


class LiveError(Exception):
    """A live run failed (a process died, no progress, requests failed); one line for the user."""


# ---- what to launch ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    device: str  # as the worker sees it
    env: dict[str, str] = field(default_factory=dict)
    gpu: int | None = None  # the physical GPU index, if any


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Everything the scheduler and worker processes are started with."""

    workers: tuple[WorkerSpec, ...]
    model: str = "tiny-llada"
    weights: str = "random"
    pages: int = TINY_PAGES
    mask_len: int = 1024
    mode: str = "colocated"
    policy: str = Policy.DEFICIT.value
    budget: int = 1024
    prefill_budget: int = 2048
    max_decodes: int = 64
    theta: int = 8192
    seed: int = 0
    threads: int = 1
    cuda_graphs: bool = True
    quantization: str | None = None  # 'fp8': the workers quantize the model's linear layers at load
    kv_cache_dtype: str = "auto"  # 'fp8': the workers store their paged KV in FP8 E4M3
    host: str = "127.0.0.1"
    port: int = 0
    iteration_log: Path | None = None
    kv_transport: str = "auto"
    transfer_timeout: float = 30.0
    transfer_attempts: int = 3
    dist_timeout: float = 120.0
    restart_workers: bool = False  # a dead (or lost) worker gets a new process on its device
    restart_limit: int = 5  # restarts in a row that die early before a worker is given up (RestartPolicy)
    worker_timeout: float = 30.0  # a worker holding work that has not reported for this long is lost
    fault_stall_recv: int | None = None  # tests: every worker stalls this request's KV receives
    api_key: str | None = field(default=None, repr=False)  # required on the client port when set
    stop_at_eos: bool = (
        False  # a request ends after the block that commits EOS (unless its forwards are forced)
    )
    max_model_len: int | None = None  # context window; None: the model's documented one

    @property
    def layout(self) -> Layout:
        return parse_mode(self.mode, len(self.workers))

    @property
    def transport(self) -> str:
        return resolve_transport(self.kv_transport, self.workers)


def resolve_transport(requested: str, workers: Sequence[WorkerSpec]) -> str:
    """The KV transport: gloo on CPU or when workers share a GPU, NCCL between distinct GPUs."""
    gpus = [w.gpu for w in workers]
    on_gpu = all(g is not None for g in gpus)
    shared = len(set(gpus)) < len(gpus)
    if requested == "auto":
        return "nccl" if on_gpu and not shared else "gloo"
    if requested == "nccl" and not on_gpu:
        raise ValueError("--kv-transport nccl needs GPU workers")
    if requested == "nccl" and shared:
        raise ValueError("--kv-transport nccl cannot join two workers on one GPU (NCCL refuses it); use gloo")
    if requested not in KV_TRANSPORTS:
        raise ValueError(f"unknown KV transport {requested!r} (known: auto, {', '.join(KV_TRANSPORTS)})")
    return requested


def host_rendezvous(timeout_s: float) -> TCPStore:
    """The KV links' rendezvous store, hosted by this process on a free port (`.port`) until the object
    is dropped; the workers connect to it as clients (`executor.transfer.links.open_store`)."""
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def cpu_workers(n: int) -> tuple[WorkerSpec, ...]:
    return tuple(WorkerSpec("cpu") for _ in range(n))


def gpu_workers(indices: Sequence[int]) -> tuple[WorkerSpec, ...]:
    return tuple(WorkerSpec("cuda:0", {"CUDA_VISIBLE_DEVICES": str(i)}, gpu=i) for i in indices)


def visible_gpus() -> int:
    """CUDA devices this process sees (counted through NVML: no CUDA context in the launcher)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---- the processes -----------------------------------------------------------------------------------


WATCH_INTERVAL_S = 0.1  # how often the watch thread looks at the workers' processes
LOST_EVERY = 5  # and, with restarts, every this many looks, the scheduler's lost workers


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    worker: int | None = None  # the worker id of a worker process
    reported: bool = False  # its exit was told to the scheduler
    started: float = field(default_factory=time.monotonic)

    def exit_reason(self, code: int) -> str:
        """How the process ended, as a phrase: the signal that killed it, or its status and the error
        line it printed last (only a line it wrote as its error, never some older log line)."""
        if code < 0:
            with suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
        self.log_file.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [line.strip() for line in lines if ": error: " in line]
        return f"exited with status {code}" + (f" ({errors[-1]})" if errors else "")


class LocalCluster:
    """The scheduler and worker processes of one live deployment on this host."""

    def __init__(self, spec: ClusterSpec, log_dir: Path | None = None) -> None:
        self.spec = spec
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="sangam-live-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []  # every process started, restarted workers' old ones included
        self.secret = secrets.token_hex(32)  # the run's secret: between scheduler and workers
        self.address = ""
        self.control = ""  # the scheduler's Control port (the launcher reports worker exits there)
        self.client: SangamClient | None = None
        self.restarts = 0  # worker processes started again
        self.exits: list[str] = []  # worker processes that ended during the run, one line each
        self.gave_up: dict[int, str] = {}  # workers given up (no new process will come), and why
        self._launches: dict[int, WorkerLaunch] = {}
        self._rendezvous: TCPStore | None = None  # the KV links' store (disaggregated and hybrid layouts)
        self._stopping = False
        self._stopped = False
        self._watch: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._children_lock = threading.Lock()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 600.0) -> ClusterStatus:
        """Start every process; return once all workers have registered and the scheduler is ready."""
        from executor.control.client import SangamClient, SangamError

        spec = self.spec
        deadline = time.monotonic() + timeout
        ready_file = self.log_dir / "scheduler.json"
        ready_file.unlink(missing_ok=True)
        layout = spec.layout  # ValueError for a mode that does not fit the workers
        if layout.num_workers != len(spec.workers):
            raise ValueError(
                f"mode {spec.mode!r} names {layout.num_workers} workers, not {len(spec.workers)}"
            )
        scheduler = SchedulerLaunch(
            workers=len(spec.workers), mode=spec.mode, mask_len=spec.mask_len, theta=spec.theta,
            policy=spec.policy,
            transfer_attempts=spec.transfer_attempts, seed=spec.seed, stop_at_eos=spec.stop_at_eos,
            host=spec.host, port=spec.port, ready_file=str(ready_file), secret=self.secret,
            api_key=spec.api_key,
            iteration_log=str(spec.iteration_log) if spec.iteration_log is not None else None,
            restart_workers=spec.restart_workers, worker_timeout=spec.worker_timeout,
        )  # fmt: skip
        if layout.kind is not Kind.COLOCATED:
            self._rendezvous = host_rendezvous(spec.dist_timeout)
        dist_port = self._rendezvous.port if self._rendezvous is not None else 0
        self._spawn("scheduler", "executor.control.scheduler_service", scheduler, {})
        while not ready_file.exists():
            self.check()
            if time.monotonic() > deadline:
                raise LiveError(f"the scheduler did not start within {timeout:g} s (logs: {self.log_dir})")
            time.sleep(0.02)
        info = json.loads(ready_file.read_text())
        self.address, self.control = info["address"], info["control"]
        for index, worker in enumerate(spec.workers):
            launch = WorkerLaunch(
                worker_id=index, scheduler=info["control"], model=spec.model, weights=spec.weights,
                device=worker.device, pages=spec.pages, policy=spec.policy, budget=spec.budget,
                prefill_budget=spec.prefill_budget, mode=spec.mode, num_workers=len(spec.workers),
                max_decodes=spec.max_decodes, seed=spec.seed, threads=spec.threads,
                cuda_graphs=spec.cuda_graphs, secret=self.secret, kv_transport=spec.transport,
                dist_port=dist_port,
                transfer_timeout=spec.transfer_timeout, dist_timeout=spec.dist_timeout,
                fault_stall_recv=spec.fault_stall_recv, max_model_len=spec.max_model_len,
                quantization=spec.quantization, kv_cache_dtype=spec.kv_cache_dtype,
            )  # fmt: skip
            self._launches[index] = launch
            self._spawn(f"worker {index}", "executor.worker.process", launch, worker.env, index)
        # the api key opens every client call; without one, the secret opens the client port's Shutdown
        self.client = SangamClient(self.address, api_key=spec.api_key or self.secret)
        while True:
            self.check()
            try:
                status = self.client.status()
            except SangamError:
                status = None
            if status is not None:
                if status.failure:
                    raise LiveError(status.failure)
                if status.ready:
                    self._watch = threading.Thread(target=self._watch_workers, name="watch", daemon=True)
                    self._watch.start()
                    return status
            if time.monotonic() > deadline:
                registered = status.workers_registered if status is not None else 0
                raise LiveError(
                    f"{registered} of {len(spec.workers)} workers ready after {timeout:g} s "
                    f"(logs: {self.log_dir})"
                )
            time.sleep(0.05)

    def _spawn(
        self,
        name: str,
        module: str,
        launch: SchedulerLaunch | WorkerLaunch,
        extra_env: dict[str, str],
        worker: int | None = None,
    ) -> None:
        """Start `python -m module` with `launch` written to its stdin."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", str(self.spec.threads))
        env.update(extra_env)
        restart = f"-restart{self.restarts}" if worker is not None and self.restarts else ""
        log_path = self.log_dir / f"{name.replace(' ', '-')}{restart}.log"
        log_file = log_path.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: a terminal's Ctrl-C reaches only the launcher
        )
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(encode(launch))
        with self._children_lock:
            self.children.append(Child(name, proc, log_path, log_file, worker))

    def check(self) -> None:
        """Raise LiveError if the scheduler has exited (or, before the cluster is up, any process)."""
        if self._stopping:
            return
        with self._children_lock:
            children = self.children if self._watch is None else self.children[:1]
        for child in children:
            code = child.proc.poll()
            if code is not None:
                raise LiveError(f"{child.name} {child.exit_reason(code)} (logs: {self.log_dir})")

    # ---- the watch thread: lost and dead workers ------------------------------------------------------

    def _watch_workers(self) -> None:
        """Tell the scheduler of every worker process that ended; restart it if asked, after a backoff
        (`sangam.restarts`), or give it up (told to the scheduler as final, and printed) once restarts
        in a row died at start. With restarts, a worker declared lost whose process lives on (stopped,
        hung) is killed first."""
        from executor.control.client import SangamError, report_worker_exit
        from executor.control.messages import WorkerExit

        restarts = Restarts(RestartPolicy(limit=self.spec.restart_limit))
        due: dict[int, float] = {}  # worker -> when its new process starts
        looks = 0
        while not self._watch_stop.wait(WATCH_INTERVAL_S):
            looks += 1
            for child in self._workers():
                code = child.proc.poll()
                if code is None or child.reported:
                    continue
                worker, now = child.worker, time.monotonic()
                assert worker is not None
                child.reported = True
                why = child.exit_reason(code)
                self.exits.append(f"{child.name} (pid {child.proc.pid}) {why}")
                wait = restarts.on_exit(worker, now - child.started) if self.spec.restart_workers else None
                final = self.spec.restart_workers and wait is None
                reason = f"{why}; {restarts.gave_up(worker)}" if final else why
                if not report_worker_exit(
                    self.control, WorkerExit(worker, child.proc.pid, reason, final), self.secret
                ):
                    return  # the scheduler is gone: `check` says so
                if final:
                    self.gave_up[worker] = reason
                    print(f"sangam: error: {child.name} {reason}", file=sys.stderr, flush=True)
                elif wait is not None:
                    due[worker] = now + wait
                    print(
                        f"sangam: {child.name} (pid {child.proc.pid}) {why}; restarting it in {wait:g} s "
                        f"(restart {restarts.row[worker]} of at most {self.spec.restart_limit} in a row)",
                        file=sys.stderr, flush=True,
                    )  # fmt: skip
            for worker, at in list(due.items()):
                if time.monotonic() >= at and not self._watch_stop.is_set():
                    del due[worker]
                    self._restart(worker)
            if self.spec.restart_workers and looks % LOST_EVERY == 0:
                with suppress(SangamError):
                    self._kill_lost()

    def _workers(self) -> list[Child]:
        with self._children_lock:
            return [c for c in self.children if c.worker is not None]

    def _restart(self, worker: int) -> None:
        self.restarts += 1
        launch = replace(self._launches[worker], rejoin=True)
        self._spawn(
            f"worker {worker}", "executor.worker.process", launch, self.spec.workers[worker].env, worker
        )

    def _kill_lost(self) -> None:
        assert self.client is not None
        lost = {w.pid for w in self.client.status().workers if w.lost}
        for child in self._workers():
            if child.proc.pid in lost and child.proc.poll() is None:
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.proc.pid, signal.SIGKILL)

    @property
    def pids(self) -> list[int]:
        return [child.proc.pid for child in self.children]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process: Shutdown call, then SIGTERM, then SIGKILL; never leaves one behind. Half
        of `timeout` (5 s at most) goes to the Shutdown, a quarter (3 s at most) to SIGTERM."""
        if self._stopped:
            return
        self._stopping = True
        self._watch_stop.set()
        with _ignoring_interrupts():
            if self._watch is not None and self._watch is not threading.current_thread():
                self._watch.join(timeout=5.0)
            try:
                if self.client is not None and self.children and self.children[0].proc.poll() is None:
                    with suppress(Exception):  # the scheduler may be gone already
                        self.client.shutdown()
                    _wait_all(self.children, min(timeout / 2, 5.0))
            finally:
                for sig, grace in ((signal.SIGTERM, min(3.0, timeout / 4)), (signal.SIGKILL, 5.0)):
                    # Only unreaped children: their pids (and process groups) cannot have been reused.
                    alive = [c for c in self.children if c.proc.poll() is None]
                    for child in alive:
                        with suppress(ProcessLookupError, PermissionError):
                            os.killpg(child.proc.pid, sig)
                    _wait_all(alive, grace)
                for child in self.children:
                    child.log_file.close()
                if self.client is not None:
                    self.client.close()
                self._rendezvous = None  # every worker is gone: the store closes
                self._stopped = True

    def remove_logs(self) -> None:
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def _wait_all(children: Sequence[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for child in children:
        with suppress(subprocess.TimeoutExpired):
            child.proc.wait(max(0.0, deadline - time.monotonic()))


@contextmanager
def _ignoring_interrupts() -> Iterator[None]:
    """Let a shutdown finish although the user presses Ctrl-C again or a second SIGTERM comes (main thread
    only): cut short, it would leave the scheduler and workers, in sessions of their own, running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():  # None: a handler not set from Python; the default stands in
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
