"""What the launcher hands each child process: one typed spec, serialized as JSON on the child's stdin.

The children (`python -m executor.control.scheduler_service`, `python -m executor.worker.process`) take
no options of their own: the launcher resolves every value from the run's config and writes the spec to
an inherited pipe. The run's secret and the api key travel only this way: never on a command line or in
the environment.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import IO, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SchedulerLaunch:
    workers: int  # that will register, ids 0..N-1
    mode: str
    mask_len: int
    theta: int
    policy: str  # fastdllm: the router keeps each worker its request's until the request ends
    transfer_attempts: int  # per KV transfer, before ERROR
    seed: int  # router tie-breaks (the sim's 'router' stream)
    stop_at_eos: bool  # end a request after the block with EOS
    host: str  # client-facing address
    port: int
    ready_file: str  # the bound addresses are written here (JSON) once listening
    secret: str  # the run's secret (executor.control.auth): required between scheduler and workers
    api_key: str | None = None  # required on the client port when set
    iteration_log: str | None = None
    restart_workers: bool = False  # lost workers come back: a layout unable to serve waits for them
    worker_timeout: float = 30.0  # a worker holding work that has not reported for this long is lost
    control_port: int = 0
    exit_with_parent: bool = True
    log_level: str = "WARNING"


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    worker_id: int
    scheduler: str  # host:port of the scheduler's Control service
    model: str
    weights: str  # 'random' or a local HF checkpoint directory
    device: str
    pages: int
    policy: str
    budget: int  # tau of colocated and decode-role workers
    prefill_budget: int  # tau of a prefill-role worker
    mode: str
    num_workers: int
    max_decodes: int
    seed: int  # random weights, identical on every worker
    threads: int  # torch CPU threads
    cuda_graphs: bool
    secret: (
        str  # the run's secret (executor.control.auth): presented to the scheduler, required by this worker
    )
    kv_transport: str = "gloo"
    quantization: str | None = None  # 'fp8': quantize the linear layers at load (executor.model.fp8)
    kv_cache_dtype: str = "auto"  # 'fp8': the paged KV in FP8 E4M3 (executor.model.kv_cache)
    dist_port: int = 0  # KV rendezvous store port (the launcher hosts it)
    dist_host: str = "127.0.0.1"
    transfer_timeout: float = 30.0
    dist_timeout: float = 120.0
    fault_stall_recv: int | None = None  # tests: stall this request's receives
    hang_timeout: float = 300.0  # report unhealthy if one iteration runs this long
    rejoin: bool = False  # a restarted process: KV links are built when first used, not at start-up
    max_model_len: int | None = None  # the context window registered; None: the model's documented one
    host: str = "127.0.0.1"
    port: int = 0
    exit_with_parent: bool = True
    log_level: str = "WARNING"


def encode(spec: SchedulerLaunch | WorkerLaunch) -> bytes:
    return json.dumps(dataclasses.asdict(spec)).encode()


def read_spec(kind: type[T], stream: IO[str]) -> T:
    """The spec the launcher wrote to `stream`; ValueError if it is not one."""
    try:
        return kind(**json.loads(stream.read()))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"expected a {kind.__name__} as JSON on stdin: {err}") from None
