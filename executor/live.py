"""`sangam live`: start the scheduler and the workers as processes, replay a workload, write results.

The workload comes from the same generators and trace readers as `sangam sim`, so a live run and a sim run
of one seed see the same lengths, arrival times and (with `--unmask schedule`) the same forwards per
block. Results go through `sangam.results`, the one format both write, and the same table is printed.

This module imports only the standard library and `sangam` at import time (the CLI builds its parser
from `add_live_arguments` without loading torch or grpc); the client loads lazily.

Layouts: `--mode colocated` (or `<n>C`), and disaggregated `<n>P<m>D` and hybrid `<n>P<m>C`, whose
workers 0..n-1 are the prefill pool (budget `--prefill-budget`) and the rest the decode role. Those move KV
over torch.distributed (`executor.kv_transfer`): worker 0 hosts the rendezvous store on a port the
launcher picks; the transport is gloo on CPU, NCCL when every worker has a GPU of its own, and gloo
through pinned host memory when workers share a GPU (`--gpus 0,0`: NCCL refuses two ranks on one device).

Processes (`executor.launcher`): `python -m executor.scheduler` first, then one `python -m executor.worker`
per GPU (or per `--workers` on CPU); a failed run's error quotes the log directory and a log's last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.launcher import (
    KV_TRANSPORTS,
    ClusterSpec,
    LiveError,
    LocalCluster,
    cpu_workers,
    gpu_workers,
    resolve_transport,
    sigterm_as_interrupt,
    visible_gpus,
)
from executor.live_models import LIVE_MODELS, TINY_PAGES, lookup_live_model
from sangam.args import non_negative_float, port_number, positive_float, positive_int
from sangam.batcher import Policy
from sangam.config import RunConfig
from sangam.hardware import BLOCK, kv_pages, lookup_gpu, lookup_model
from sangam.layout import Kind, parse_mode
from sangam.request import Request

if TYPE_CHECKING:
    from executor.proto import sangam_pb2 as pb

DEFAULTS = RunConfig()
LIVE_NUM_REQUESTS = 100
CPU_NUM_REQUESTS = 16  # full-length ShareGPT sequences on the tiny CPU model: about a minute
SERVE_PORT = 50051
MAX_IN_FLIGHT = 32  # Submit calls the replay keeps open at once
SETTLE_S = 10.0  # after the last request: how long the run waits for KV sources to release their pages


def _threshold(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a threshold in (0, 1], got {text!r}")
    return value


def _gpu_list(text: str) -> list[int]:
    """`N` (the first N visible GPUs) or a comma list of indices `0,2,3`; a repeated index (`0,0`) puts
    several workers on one GPU."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a GPU count or a list like 0,1,3, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected a GPU count or a list like 0,1,3, got {text!r}")
    if len(values) == 1 and "," not in text:
        if values[0] == 0:
            raise argparse.ArgumentTypeError("--gpus needs at least one GPU")
        return list(range(values[0]))
    return values


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `sangam live` (the CLI adds them to its `live` subcommand)."""
    placement = parser.add_argument_group("processes")
    placement.add_argument(
        "--mode",
        default="colocated",
        help="colocated, <n>C, <n>P<m>D (disaggregated) or <n>P<m>C (hybrid); workers 0..n-1 prefill",
    )
    placement.add_argument(
        "--gpus",
        type=_gpu_list,
        help="GPU count or indices, one worker each; 0,0 puts two on GPU 0 (default: every visible GPU)",
    )
    placement.add_argument("--workers", type=positive_int, help="run N CPU workers instead (tests, no GPU)")
    placement.add_argument(
        "--model",
        choices=sorted(LIVE_MODELS),
        help="served model (default: llada-8b on GPU, tiny-llada on CPU); ignored with --weights PATH",
    )
    placement.add_argument("--weights", default="random", help="'random' or a local HF checkpoint directory")
    placement.add_argument(
        "--gpu", default=DEFAULTS.gpu, help="h100 or h200: sizes the default KV pool, as in sangam sim"
    )
    placement.add_argument(
        "--pages", type=positive_int, help=f"KV pages per worker (tiny default {TINY_PAGES})"
    )
    placement.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads per worker")
    placement.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay decode-only iterations from CUDA graphs (GPU workers)",
    )
    placement.add_argument("--host", default="127.0.0.1", help="address the scheduler's client port binds")
    placement.add_argument(
        "--port", type=port_number, help=f"client port (default {SERVE_PORT} with --serve, else any)"
    )
    placement.add_argument("--serve", action="store_true", help="serve external clients until Ctrl-C")
    placement.add_argument("--log-dir", type=Path, help="process logs (default: a temporary directory)")
    placement.add_argument("--startup-timeout", type=positive_float, default=600.0, help="seconds")
    placement.add_argument(
        "--stall-timeout", type=positive_float, default=300.0, help="fail after this long without progress"
    )

    workload = parser.add_argument_group("workload (as in sangam sim)")
    workload.add_argument(
        "--trace", default=DEFAULTS.trace, help="sharegpt, arxiv, or a .csv/.jsonl trace file"
    )
    workload.add_argument("--qps", type=positive_float, default=DEFAULTS.qps)
    workload.add_argument(
        "--num-requests",
        type=positive_int,
        help=f"requests to replay (default {LIVE_NUM_REQUESTS}, {CPU_NUM_REQUESTS} on CPU)",
    )
    workload.add_argument(
        "--arrival-cv", type=positive_float, help="gamma arrivals with this CV (default Poisson)"
    )
    workload.add_argument(
        "--mask-len", type=positive_int, help="mask buffer (default 1024 ShareGPT, 512 arXiv)"
    )
    workload.add_argument(
        "--progress", help="forwards per block: fixed:D, uniform:LO:HI, betabinom:MEAN:STD, empirical:FILE"
    )
    workload.add_argument("--seed", type=int, default=DEFAULTS.seed)

    policy = parser.add_argument_group("scheduling")
    policy.add_argument("--budget", type=positive_int, default=DEFAULTS.budget, help="tau of every worker")
    policy.add_argument(
        "--prefill-budget",
        type=positive_int,
        default=DEFAULTS.prefill_budget,
        help="tau of prefill-role workers",
    )
    policy.add_argument(
        "--theta", type=positive_int, default=DEFAULTS.theta, help="hybrid overflow threshold"
    )
    policy.add_argument("--policy", choices=[p.value for p in Policy], default=DEFAULTS.policy.value)
    policy.add_argument("--max-decodes", type=positive_int, default=DEFAULTS.max_decodes)

    kv = parser.add_argument_group("KV transfer (<n>P<m>D and <n>P<m>C)")
    kv.add_argument(
        "--kv-transport",
        choices=["auto", *KV_TRANSPORTS],
        default="auto",
        help="auto: gloo on CPU and on a shared GPU (through pinned host memory), nccl between distinct GPUs",
    )
    kv.add_argument("--transfer-timeout", type=positive_float, default=30.0, help="seconds per attempt")
    kv.add_argument(
        "--transfer-attempts", type=positive_int, default=3, help="attempts per transfer before ERROR"
    )
    kv.add_argument(
        "--dist-timeout",
        type=positive_float,
        default=120.0,
        help="seconds for the KV rendezvous at start-up and for rebuilding a link",
    )

    sampling = parser.add_argument_group("unmasking")
    sampling.add_argument(
        "--unmask",
        choices=["schedule", "threshold"],
        help="schedule: each block takes the progress model's forwards (default with random weights); "
        "threshold: confidence threshold (default with real weights)",
    )
    sampling.add_argument("--threshold", type=_threshold, default=0.9)
    sampling.add_argument("--temperature", type=non_negative_float, default=0.0)

    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, help="write requests.csv, blocks.csv and summary.json here")
    output.add_argument(
        "--iteration-log", type=Path, help="one CSV row per worker iteration, plus gpu_s and items"
    )


# ---- a run -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LivePlan:
    """The resolved run: config, processes and unmasking."""

    config: RunConfig
    cluster: ClusterSpec
    model: str
    unmask: str
    threshold: float
    temperature: float
    devices: tuple[str, ...]

    def resolved(self) -> dict[str, Any]:
        out = self.config.resolved()
        out.update(
            live_model=self.model,
            kv_transport=self.cluster.transport if self.config.layout.kind is not Kind.COLOCATED else None,
            weights=self.cluster.weights,
            unmask=self.unmask,
            threshold=self.threshold,
            temperature=self.temperature,
            devices=list(self.devices),
            workers=len(self.devices),
        )
        return out


def _checkpoint_spec(path: Path) -> str:
    """The sangam.hardware model a local checkpoint is shaped like (from config.json)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--weights {path}: cannot read config.json: {err}") from None
    architecture = (raw.get("architectures") or [None])[0]
    known = {"LLaDAModelLM": "llada-8b", "DreamModel": "dream-7b"}
    if architecture not in known:
        raise ValueError(f"--weights {path}: architecture {architecture!r} is not LLaDAModelLM or DreamModel")
    return known[architecture]


def plan_run(args: argparse.Namespace) -> LivePlan:
    """Validate the options and resolve every default; ValueError for bad input."""
    if args.workers is not None and args.gpus is not None:
        raise ValueError("--workers (CPU workers) and --gpus exclude each other")
    if args.workers is not None:
        workers = cpu_workers(args.workers)
    else:
        count = visible_gpus()
        indices = args.gpus if args.gpus is not None else list(range(count))
        if indices and max(indices) >= count:
            raise ValueError(f"--gpus {','.join(map(str, indices))}: only {count} CUDA devices are visible")
        # no GPU: as many CPU workers as the mode names (one for plain colocated)
        workers = gpu_workers(indices) if indices else cpu_workers(parse_mode(args.mode, 1).num_workers)
    on_cpu = workers[0].device == "cpu"
    layout = parse_mode(args.mode, len(workers))
    if layout.num_workers != len(workers):
        raise ValueError(
            f"mode {args.mode!r} names {layout.num_workers} workers but {len(workers)} are started"
        )
    random_weights = args.weights == "random"
    if random_weights:
        model = args.model or ("tiny-llada" if on_cpu else "llada-8b")
        spec_name = lookup_live_model(model).spec
        tiny = lookup_live_model(model).tiny
    else:
        model, tiny = str(args.weights), False
        spec_name = _checkpoint_spec(Path(args.weights))
    if tiny and not on_cpu:
        raise ValueError(f"{model} is a CPU test model; use llada-8b or dream-7b on GPUs")
    pages = args.pages or (TINY_PAGES if tiny else None)
    per_gpu = max((sum(w.gpu == g for w in workers) for g in {w.gpu for w in workers}), default=1)
    if pages is None and not on_cpu and per_gpu > 1:  # the GPU's KV memory is split between its workers
        pages = kv_pages(lookup_model(spec_name), lookup_gpu(args.gpu), per_gpu)
    transport = resolve_transport(args.kv_transport, workers)
    config = RunConfig(
        mode=args.mode,
        model=spec_name,
        gpu=args.gpu,
        gpus=len(workers),
        trace=args.trace,
        qps=args.qps,
        num_requests=args.num_requests or (CPU_NUM_REQUESTS if on_cpu else LIVE_NUM_REQUESTS),
        arrival_cv=args.arrival_cv,
        mask_len=args.mask_len,
        budget=args.budget,
        prefill_budget=args.prefill_budget,
        theta=args.theta,
        policy=Policy(args.policy),
        max_decodes=args.max_decodes,
        pages=pages,
        seed=args.seed,
    )
    if config.kv_pages <= 0:
        raise ValueError(f"no KV pages left for {spec_name} on {args.gpu}; give --pages")
    port = args.port if args.port is not None else (SERVE_PORT if args.serve else 0)
    cluster = ClusterSpec(
        workers=workers,
        model=model if random_weights else "llada-8b",
        weights=args.weights,
        pages=config.kv_pages,
        mask_len=config.mask_tokens,
        mode=args.mode,
        policy=args.policy,
        budget=args.budget,
        prefill_budget=args.prefill_budget,
        max_decodes=args.max_decodes,
        theta=args.theta,
        seed=args.seed,
        threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        host=args.host,
        port=port,
        iteration_log=args.iteration_log,
        kv_transport=transport,
        transfer_timeout=args.transfer_timeout,
        transfer_attempts=args.transfer_attempts,
        dist_timeout=args.dist_timeout,
    )
    unmask = args.unmask or ("schedule" if random_weights else "threshold")
    return LivePlan(
        config, cluster, model, unmask, args.threshold, args.temperature, tuple(w.device for w in workers)
    )


def workload(plan: LivePlan, args: argparse.Namespace) -> tuple[list[Request], list[int]]:
    """The requests of the run (sim's generators) and each one's trace output length."""
    from sangam.config import build_requests, synthetic_rows, with_arrival_times

    cfg = plan.config
    progress = None
    if args.progress:
        from sangam.progress import empirical, parse_progress

        kind, _, path = args.progress.partition(":")
        if kind == "empirical":
            from sangam.traces import read_steps

            progress = empirical(read_steps(Path(path)))
        else:
            progress = parse_progress(args.progress)
    if cfg.is_synthetic:
        rows = synthetic_rows(cfg)
    else:
        from sangam.traces import read_trace

        rows = with_arrival_times(cfg, read_trace(Path(cfg.trace))[: cfg.num_requests])
    requests = build_requests(cfg, rows, progress)
    blocks = cfg.mask_tokens // BLOCK
    for req in requests:
        if req.n_blocks > blocks:
            raise ValueError(
                f"request {req.id}: {req.output_len} output tokens need {req.n_blocks} blocks, the "
                f"{cfg.mask_tokens}-token mask buffer holds {blocks}; raise --mask-len"
            )
    return requests, [row.output_len for row in rows]


def replay(
    cluster: LocalCluster, plan: LivePlan, requests: Sequence[Request], vocab: int, mask_id: int
) -> dict[int, int]:
    """Submit every request at its arrival time; scheduler id -> request index."""
    from executor.proto import sangam_pb2 as pb

    assert cluster.client is not None
    cfg = plan.config
    prompts = cfg.rng("prompts")
    seeds = cfg.rng("sampling")
    pending: list[tuple[int, Any]] = []
    in_flight: deque[tuple[int, Any]] = deque()
    start = time.monotonic()
    for req in sorted(requests, key=lambda r: (r.arrival, r.id)):
        prompt = [
            t if t < mask_id else t + 1 for t in (prompts.randrange(vocab - 1) for _ in range(req.prompt_len))
        ]
        sampling = pb.SamplingParams(
            threshold=plan.threshold, temperature=plan.temperature, seed=seeds.getrandbits(62)
        )
        message = pb.SubmitRequest(
            prompt_token_ids=prompt,
            gen_len=BLOCK * req.n_blocks,
            sampling=sampling,
            forwards=list(req.steps) if plan.unmask == "schedule" else [],
        )
        while (wait := start + req.arrival - time.monotonic()) > 0:
            cluster.check()
            time.sleep(min(wait, 0.05))
        while len(in_flight) >= MAX_IN_FLIGHT:  # a burst must not exceed the server's concurrent calls
            _submitted(cluster, *in_flight.popleft())  # a failed call ends the replay here, not at the end
        future = cluster.client.submit_future(message)
        in_flight.append((req.id, future))
        pending.append((req.id, future))
    return {_submitted(cluster, index, future).request_id: index for index, future in pending}


def _submitted(cluster: LocalCluster, index: int, future: Any) -> pb.SubmitReply:
    """The reply of request `index`'s Submit; LiveError if the call failed."""
    try:
        reply: pb.SubmitReply = future.result()
    except Exception as err:
        cluster.check()
        raise LiveError(f"submitting request {index} failed: {describe(err)}") from None
    return reply


def describe(err: BaseException) -> str:
    """One line for a failed call."""
    import grpc

    from executor.rpc import describe as describe_rpc

    return describe_rpc(err) if isinstance(err, grpc.RpcError) else f"{type(err).__name__}: {err}"


def wait_for_all(cluster: LocalCluster, total: int, stall_timeout: float) -> pb.StatusReply:
    """Until every submitted request is DONE or ERROR; LiveError on a death or a stall."""
    assert cluster.client is not None
    progress, since = (-1, -1), time.monotonic()
    while True:
        cluster.check()
        status = cluster.client.status()
        if status.failure:
            raise LiveError(status.failure)
        if status.done + status.errors >= total:
            return status
        if (status.done, status.iterations) != progress:
            progress, since = (status.done, status.iterations), time.monotonic()
        elif time.monotonic() - since > stall_timeout:
            raise LiveError(
                f"no progress for {stall_timeout:g} s with {total - status.done - status.errors} requests "
                f"unfinished (logs: {cluster.log_dir})"
            )
        time.sleep(0.05)


def page_leaks(status: pb.StatusReply) -> str:
    """Empty if every worker has all its pages free and the router's tally agrees; else what is not."""
    out = []
    for w in status.workers:
        if w.free_pages != w.pages:
            out.append(f"worker {w.worker_id} has {w.free_pages} of {w.pages} pages free")
        if status.layout and "P" in status.layout and w.router_free != status.pages:
            out.append(f"the router counts {w.router_free} of {status.pages} free on worker {w.worker_id}")
    if status.transfers_in_flight:
        out.append(f"{status.transfers_in_flight} KV transfers not released")
    return "; ".join(out)


def settle(cluster: LocalCluster, timeout: float) -> pb.StatusReply:
    """The status once no KV transfer is in flight and every worker reported all its pages free (or
    after `timeout` seconds: `page_leaks` then says what is missing)."""
    assert cluster.client is not None
    deadline = time.monotonic() + timeout
    while True:
        cluster.check()
        status = cluster.client.status()
        if not page_leaks(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def rebuild(
    records: Sequence[pb.RequestRecord], ids: dict[int, int], output_lens: Sequence[int], origin: float
) -> list[Request]:
    """Finished requests with the trace's ids and lengths, times relative to `origin`, the scheduler's
    first accepted arrival (`StatusReply.first_arrival`, the iteration log's origin too)."""
    from executor.scheduler import request_from_record

    requests = []
    for record in records:
        req = request_from_record(record, shift=origin)
        index = ids.get(record.request_id, record.request_id)
        req.id = index
        if index < len(output_lens) and -(-output_lens[index] // BLOCK) == req.n_blocks:
            req.output_len = output_lens[index]  # the trace's, as the simulator counts it
        requests.append(req)
    return sorted(requests, key=lambda r: r.id)


def run_live(args: argparse.Namespace) -> int:
    """`sangam live`; bad options raise ValueError (exit 2), a failed run prints one line (exit 1)."""
    plan = plan_run(args)
    requests, output_lens = ([], []) if args.serve else workload(plan, args)
    if requests:  # a trace file may hold fewer requests than --num-requests asks for
        plan = replace(plan, config=replace(plan.config, num_requests=len(requests)))
    try:
        with sigterm_as_interrupt():
            return _serve(plan, args) if args.serve else _replay(plan, args, requests, output_lens)
    except LiveError as err:
        print(f"sangam: error: {err}", file=sys.stderr)
        return 1


@contextmanager
def _running(plan: LivePlan, args: argparse.Namespace) -> Iterator[tuple[LocalCluster, pb.StatusReply]]:
    """A started cluster, stopped on the way out; its logs are kept only if something failed. A call to
    the scheduler that fails (a live but unresponsive scheduler) ends the run as a LiveError."""
    from executor.client import SangamError

    cluster = LocalCluster(plan.cluster, args.log_dir)
    keep_logs = True
    try:
        status = cluster.start(args.startup_timeout)
        yield cluster, status
        keep_logs = False
    except KeyboardInterrupt:
        keep_logs = False
        raise
    except SangamError as err:
        cluster.check()  # a process that died is the better reason
        raise LiveError(f"the scheduler stopped answering: {err} (logs: {cluster.log_dir})") from None
    finally:
        cluster.stop()
        if not keep_logs:
            cluster.remove_logs()


def _replay(plan: LivePlan, args: argparse.Namespace, requests: list[Request], output_lens: list[int]) -> int:
    from sangam.report import print_sim_table
    from sangam.results import request_row, summarize, write_results

    started = time.monotonic()
    with _running(plan, args) as (cluster, status):
        assert cluster.client is not None
        print(
            f"sangam live: {len(plan.devices)} workers ({plan.model} on "
            f"{', '.join(sorted(set(plan.devices)))}) ready in {time.monotonic() - started:.1f} s; "
            f"replaying {len(requests)} requests",
            file=sys.stderr,
        )
        ids = replay(cluster, plan, requests, status.vocab, status.mask_id)
        wait_for_all(cluster, len(requests), args.stall_timeout)
        final = settle(cluster, SETTLE_S)
        records = cluster.client.results()
        finished_ids = {r.request_id for r in records}
        failed = [cluster.client.poll(rid) for rid in ids if rid not in finished_ids]
    finished = rebuild(records, ids, output_lens, final.first_arrival)
    if not finished:
        reason = failed[0].error if failed else "no request finished"
        raise LiveError(f"all {len(requests)} requests failed: {reason}")
    summary = summarize([request_row(r) for r in finished], plan.config.model_spec.kv_bytes_per_token)
    summary.update(
        failed=len(failed),
        live_wall_s=time.monotonic() - started,
        live_iterations=final.iterations,
        live_workers=[
            {"worker": w.worker_id, "role": w.role, "pages": w.pages, "free_pages_at_end": w.free_pages}
            for w in final.workers
        ],
        config=plan.resolved(),
    )
    if plan.config.layout.kind is not Kind.COLOCATED:
        summary.update(
            kv_transfers_done=final.transfers_done,
            kv_transfers_failed=final.transfers_failed,
            kv_transfer_retries=final.transfer_retries,
        )
    if args.out:
        write_results(args.out, finished, summary)
    print_sim_table([summary], title="sangam live")
    if failed:
        raise LiveError(f"{len(failed)} of {len(requests)} requests failed: {failed[0].error}")
    unbalanced = page_leaks(final)
    if unbalanced:
        raise LiveError(f"KV pages not returned at the end: {unbalanced}")
    return 0


def _serve(plan: LivePlan, args: argparse.Namespace) -> int:
    from sangam.results import request_row, summarize, write_results

    with _running(plan, args) as (cluster, status):
        assert cluster.client is not None
        print(
            f"sangam live: serving {plan.model} on {cluster.address} with {len(plan.devices)} workers "
            f"(mask buffer {status.mask_len}, {status.pages} KV pages each; logs in {cluster.log_dir}); "
            "Ctrl-C to stop",
            flush=True,
        )
        try:
            while True:
                cluster.check()
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        client = cluster.client
        finished = rebuild(client.results(), {}, [], client.status().first_arrival) if args.out else []
    if finished:
        summary = summarize([request_row(r) for r in finished], plan.config.model_spec.kv_bytes_per_token)
        summary["config"] = plan.resolved()
        write_results(args.out, finished, summary)
    print("sangam live: stopped", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m executor.live ...`: the same as `sangam live ...`."""
    parser = argparse.ArgumentParser(prog="python -m executor.live", description="Run Sangam live.")
    add_live_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_live(args)
    except (ValueError, OSError) as err:
        print(f"sangam: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sangam: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
