"""`sangam live`: start the scheduler and the workers as processes, replay a workload, write results.

The workload comes from the same generators and trace readers as `sangam sim`, so a live run and a sim run
of one seed see the same lengths, arrival times and (with `--unmask schedule`) the same forwards per
block. Results go through `runs.results`, the one format both write, and the same table is printed.

This module imports only the standard library and `sangam` at import time; the client loads lazily.

Layouts: `--mode colocated` (or `<n>C`), and disaggregated `<n>P<m>D` and hybrid `<n>P<m>C`, whose
workers 0..n-1 are the prefill pool (budget `--prefill-budget`) and the rest the decode role. Those move
KV over torch.distributed (`executor.transfer.links`): the launcher hosts the rendezvous store, so that
any worker can restart; the transport is gloo on CPU, NCCL when every worker has a GPU of its own, and
gloo through pinned host memory when workers share a GPU (`--gpus 0,0`: NCCL refuses two ranks on one
device).

Processes (`executor.run.launcher`): `python -m executor.control.scheduler_service` first, then one
`python -m executor.worker.process` per GPU (or per `--workers` on CPU); a failed run's error quotes the
log directory and a log's last line.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from executor.control.messages import ClusterStatus, ModelFacts, RequestState, Sampling, Submission
from executor.model.config import TINY_CONTEXT, TRAITS, Family
from executor.model.hf_config import context_window, position_limit
from executor.model.live_models import TINY_PAGES, lookup_live_model
from executor.run.launcher import (
    ClusterSpec,
    LiveError,
    LocalCluster,
    cpu_workers,
    gpu_workers,
    resolve_transport,
    visible_gpus,
)
from executor.run.live_collect import Collector
from executor.run.live_options import CPU_NUM_REQUESTS, SERVE_PORT, LiveOptions
from executor.run.live_tally import LiveTally
from runs.config import RunConfig, RunFiles, build_requests, load_progress, workload_points
from runs.outdir import point_dirs
from runs.results import write_results
from runs.tally import Watcher
from sangam.hardware import BLOCK, kv_pages, lookup_gpu, lookup_model
from sangam.layout import Kind, parse_mode
from sangam.progress import ProgressModel
from sangam.request import Request
from sangam.workload import TraceRow

MAX_IN_FLIGHT = 32  # Submit calls the replay keeps open at once
SETTLE_S = 10.0  # after the last request: how long the run waits for KV sources to release their pages


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
            quantization=self.cluster.quantization,
            unmask=self.unmask,
            threshold=self.threshold,
            temperature=self.temperature,
            devices=list(self.devices),
            workers=len(self.devices),
        )
        return out

    def served(self, status: ClusterStatus | None = None) -> dict[str, Any]:
        """What a server (`sangam serve`, `sangam live --serve`) ran, for its summary.json: the model and
        its weights, each worker's device (as it registered, from `status`, else as planned), the layout
        and the scheduling; none of the simulator's workload settings (the clients chose the trace, rate
        and count) nor its modelled GPU. `model_spec` is the `sangam.hardware` model whose shapes priced
        the KV (a tiny model is a twin of one)."""
        cfg = self.config
        registered = [w.device for w in status.workers if w.device] if status is not None else []
        devices = registered if len(registered) == len(self.devices) else list(self.devices)
        colocated = cfg.layout.kind is Kind.COLOCATED
        return {
            "model": self.model,
            "model_spec": cfg.model,
            "weights": self.cluster.weights,
            "quantization": self.cluster.quantization,
            "devices": devices,
            "workers": len(self.devices),
            "mode": cfg.mode,
            "layout": cfg.layout.name,
            "kv_transport": None if colocated else self.cluster.transport,
            "kv_pages": cfg.kv_pages,
            "kv_cache_dtype": cfg.kv_cache_dtype,
            "mask_len": cfg.mask_tokens,
            "policy": cfg.policy.value,
            "budget": cfg.budget,
            "prefill_budget": None if colocated else cfg.prefill_budget,
            "theta": cfg.theta if cfg.layout.kind is Kind.HYBRID else None,
            "max_decodes": cfg.max_decodes,
            "seed": cfg.seed,
            "unmask": self.unmask,
            "threshold": self.threshold,
            "temperature": self.temperature,
        }


def _checkpoint_config(path: Path) -> dict[str, Any]:
    """A local checkpoint's config.json, parsed."""
    try:
        raw: dict[str, Any] = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--weights {path}: cannot read config.json: {err}") from None
    return raw


def _checkpoint_spec(path: Path, raw: dict[str, Any]) -> str:
    """The sangam.hardware model a local checkpoint is shaped like (from config.json)."""
    architecture = (raw.get("architectures") or [None])[0]
    known = {"LLaDAModelLM": "llada-8b", "DreamModel": "dream-7b"}
    if architecture not in known:
        raise ValueError(f"--weights {path}: architecture {architecture!r} is not LLaDAModelLM or DreamModel")
    return known[architecture]


def _context_window(args: LiveOptions, raw: dict[str, Any] | None, model: str, mask_len: int) -> None:
    """ValueError if `--max-model-len` passes the positions the model allows, or if the window leaves no
    room for a prompt beside the mask buffer. (The workers register the window; the scheduler and the
    HTTP server refuse a longer request.)"""
    if raw is not None:
        window, limit = context_window(raw), position_limit(raw)
    else:  # random weights reach as far as the config's positions (executor.model.config.full_size)
        live = lookup_live_model(model)
        window = limit = TINY_CONTEXT if live.tiny else TRAITS[Family(live.family)].positions
    if args.max_model_len is not None:
        if args.max_model_len > limit:
            raise ValueError(f"--max-model-len {args.max_model_len}: the model allows {limit} positions")
        window = args.max_model_len
    if mask_len >= window:
        raise ValueError(
            f"the {mask_len}-token mask buffer (--mask-len) leaves no room for a prompt in the context "
            f"window of {window} tokens (--max-model-len)"
        )


def plan_run(base: RunConfig, args: LiveOptions, *, requests_given: bool = True) -> LivePlan:
    """The run of `base` (whose model, worker count and pages are resolved here) on the processes of
    `args`; without `requests_given`, a CPU run replays fewer requests. ValueError for bad input."""
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
        workers = gpu_workers(indices) if indices else cpu_workers(parse_mode(base.mode, 1).num_workers)
    on_cpu = workers[0].device == "cpu"
    layout = parse_mode(base.mode, len(workers))
    if layout.num_workers != len(workers):
        raise ValueError(
            f"mode {base.mode!r} names {layout.num_workers} workers but {len(workers)} are started"
        )
    random_weights = args.weights == "random"
    raw = None
    if random_weights:
        model = args.model or ("tiny-llada" if on_cpu else "llada-8b")
        spec_name = lookup_live_model(model).spec
        tiny = lookup_live_model(model).tiny
    else:
        model, tiny = str(args.weights), False
        raw = _checkpoint_config(Path(args.weights))
        spec_name = _checkpoint_spec(Path(args.weights), raw)
    _context_window(args, raw, model, base.mask_tokens)
    if tiny and not on_cpu:
        raise ValueError(f"{model} is a CPU test model; use llada-8b or dream-7b on GPUs")
    pages = base.pages or (TINY_PAGES if tiny else None)
    per_gpu = max((sum(w.gpu == g for w in workers) for g in {w.gpu for w in workers}), default=1)
    if pages is None and not on_cpu and per_gpu > 1:  # the GPU's KV memory is split between its workers
        pages = kv_pages(lookup_model(spec_name), lookup_gpu(base.gpu), per_gpu, base.kv_cache_dtype)
    transport = resolve_transport(args.kv_transport, workers)
    config = replace(
        base,
        model=spec_name,
        gpus=len(workers),
        num_requests=base.num_requests if requests_given or not on_cpu else CPU_NUM_REQUESTS,
        pages=pages,
    )
    if config.kv_pages <= 0:
        raise ValueError(f"no KV pages left for {spec_name} on {base.gpu}; give --pages")
    port = args.port if args.port is not None else (SERVE_PORT if args.serve else 0)
    cluster = ClusterSpec(
        workers=workers,
        model=model if random_weights else "llada-8b",
        weights=args.weights,
        pages=config.kv_pages,
        mask_len=config.mask_tokens,
        mode=config.mode,
        policy=config.policy.value,
        budget=config.budget,
        prefill_budget=config.prefill_budget,
        max_decodes=config.max_decodes,
        theta=config.theta,
        seed=config.seed,
        threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        quantization=args.quantization,
        kv_cache_dtype=config.kv_cache_dtype,
        host=args.host,
        port=port,
        iteration_log=None,
        kv_transport=transport,
        transfer_timeout=args.transfer_timeout,
        transfer_attempts=args.transfer_attempts,
        dist_timeout=args.dist_timeout,
        api_key=args.api_key,
        stop_at_eos=not random_weights,
        restart_workers=args.restart_workers,
        restart_limit=args.restart_limit,
        worker_timeout=args.worker_timeout,
        max_model_len=args.max_model_len,
    )
    unmask = args.unmask or ("schedule" if random_weights else "threshold")
    return LivePlan(
        config, cluster, model, unmask, args.threshold, args.temperature, tuple(w.device for w in workers)
    )


def workload(cfg: RunConfig, rows: Sequence[TraceRow], progress: ProgressModel | None) -> list[Request]:
    """The requests of one point (the simulator's), each within the mask buffer."""
    requests = build_requests(cfg, rows, progress)
    blocks = cfg.mask_tokens // BLOCK
    for req in requests:
        if req.n_blocks > blocks:
            raise ValueError(
                f"request {req.id}: {req.output_len} output tokens need {req.n_blocks} blocks, the "
                f"{cfg.mask_tokens}-token mask buffer holds {blocks}; raise --mask-len"
            )
    return requests


def replay(
    cluster: LocalCluster,
    plan: LivePlan,
    requests: Sequence[Request],
    vocab: int,
    mask_id: int,
    poll: Callable[[], None] = lambda: None,
    ids: dict[int, int] | None = None,
) -> dict[int, int]:
    """Submit every request at its arrival time; scheduler id -> request index (into `ids`, filled as
    the submissions are answered, also when the replay ends early). `poll` runs while it waits (a
    progress watcher's)."""
    ids = {} if ids is None else ids
    in_flight: deque[tuple[int, Any]] = deque()
    try:
        _submit_all(cluster, plan, requests, vocab, mask_id, poll, ids, in_flight)
        while in_flight:
            index, future = in_flight.popleft()
            ids[_submitted(cluster, index, future).request_id] = index
    finally:  # an early end: the submissions answered meanwhile still count
        for index, future in in_flight:
            if future.done() and future.exception() is None:
                ids[future.result().request_id] = index
    return ids


def _submit_all(
    cluster: LocalCluster,
    plan: LivePlan,
    requests: Sequence[Request],
    vocab: int,
    mask_id: int,
    poll: Callable[[], None],
    ids: dict[int, int],
    in_flight: deque[tuple[int, Future[RequestState]]],
) -> None:
    assert cluster.client is not None
    cfg = plan.config
    prompts = cfg.rng("prompts")
    seeds = cfg.rng("sampling")
    start = time.monotonic()
    for req in sorted(requests, key=lambda r: (r.arrival, r.id)):
        prompt = [
            t if t < mask_id else t + 1 for t in (prompts.randrange(vocab - 1) for _ in range(req.prompt_len))
        ]
        submission = Submission(
            tuple(prompt),
            BLOCK * req.n_blocks,
            Sampling(plan.threshold, plan.temperature, seeds.getrandbits(62)),
            tuple(req.steps) if plan.unmask == "schedule" else (),
            mask_len=req.mask_len,
        )
        while (wait := start + req.arrival - time.monotonic()) > 0:
            cluster.check()
            poll()
            time.sleep(min(wait, 0.05))
        while len(in_flight) >= MAX_IN_FLIGHT:  # a burst must not exceed the server's concurrent calls
            index, future = in_flight.popleft()  # a failed call ends the replay here, not at the end
            ids[_submitted(cluster, index, future).request_id] = index
        in_flight.append((req.id, cluster.client.submit_future(submission)))


def _submitted(cluster: LocalCluster, index: int, future: Future[RequestState]) -> RequestState:
    """The first state of request `index`; LiveError if its Submit failed."""
    try:
        return future.result()
    except Exception as err:  # a SangamError names the call; anything else is a bug worth one line
        cluster.check()
        failure = _failure(cluster)
        if failure:  # the cluster cannot serve any more: that is the cause
            raise LiveError(failure) from None
        raise LiveError(f"submitting request {index} failed: {err}") from None


def _failure(cluster: LocalCluster) -> str:
    """The cluster's failure, if the scheduler answers and has one."""
    from executor.control.client import SangamError

    assert cluster.client is not None
    try:
        return cluster.client.status().failure
    except SangamError:
        return ""


def wait_for_all(
    cluster: LocalCluster, total: int, stall_timeout: float, poll: Callable[[], None] = lambda: None
) -> ClusterStatus:
    """Until every submitted request is DONE or ERROR; LiveError on a death or a stall. `poll` runs
    while it waits."""
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
        poll()
        time.sleep(0.05)


def page_leaks(status: ClusterStatus) -> str:
    """Empty if every worker has all its pages free and the router's tally agrees; else what is not.
    A lost worker (and its pages) is out of the books."""
    out = []
    pages = status.facts.pages if status.facts is not None else 0
    for w in status.workers:
        if w.lost:
            continue
        if w.free_pages != w.pages:
            out.append(f"worker {w.worker_id} has {w.free_pages} of {w.pages} pages free")
        if status.layout and "P" in status.layout and w.router_free != pages:
            out.append(f"the router counts {w.router_free} of {pages} free on worker {w.worker_id}")
    if status.transfers_in_flight:
        out.append(f"{status.transfers_in_flight} KV transfers not released")
    return "; ".join(out)


def settle(cluster: LocalCluster, timeout: float) -> ClusterStatus:
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
    finished: Sequence[Request], ids: dict[int, int], output_lens: Sequence[int], origin: float
) -> list[Request]:
    """Copies of the finished requests (`SangamClient.results`) with the trace's ids and lengths, times
    relative to `origin`, the scheduler's first accepted arrival (`ClusterStatus.first_arrival`, the
    iteration log's origin too)."""
    requests = []
    for done in finished:
        req = from_origin(done, origin)
        index = ids.get(done.id, done.id)
        req.id = index
        if index < len(output_lens) and -(-output_lens[index] // BLOCK) == req.n_blocks:
            req.output_len = output_lens[index]  # the trace's, as the simulator counts it
        requests.append(req)
    return sorted(requests, key=lambda r: r.id)


BLOCK_TIMES = ("ready", "dispatch", "prefill_start", "prefill_end", "transfer_start", "transfer_end",
               "decode_start", "end")  # fmt: skip


def from_origin(req: Request, origin: float) -> Request:
    """A copy of `req` with every time moved by `-origin`."""
    blocks = [
        replace(rec, **{n: t - origin for n in BLOCK_TIMES if (t := getattr(rec, n)) is not None})
        for rec in req.blocks
    ]
    return replace(req, arrival=req.arrival - origin, blocks=blocks)


def ready_facts(status: ClusterStatus) -> ModelFacts:
    """The model facts of a ready cluster's status (every worker has registered)."""
    if status.facts is None:
        raise LiveError(f"the scheduler is not ready: {status.workers_registered} workers registered")
    return status.facts


def run_live(
    plan: LivePlan,
    options: LiveOptions,
    files: RunFiles,
    rates: Sequence[float],
    watch: Watcher | None = None,
) -> int:
    """`sangam live` of a planned run: replay each rate's workload (or serve, with `options.serve`); bad
    input raises ValueError (exit 2), a failed run prints one line (exit 1). `watch` hears each point's
    requests finished (`executor.run.live_tally`)."""
    try:
        if options.serve:
            return _serve(plan, options, files)
        progress = load_progress(files.progress)
        points = workload_points(plan.config, rates)
        dirs = point_dirs(files.out, [cfg.qps for cfg, _ in points]) if files.out else []
        summaries: list[dict[str, Any]] = []
        for i, (cfg, rows) in enumerate(points):
            requests = workload(cfg, rows, progress)
            log = files.iteration_log
            if log is not None and len(points) > 1:
                log = log.with_name(f"{log.stem}-qps{cfg.qps:g}{log.suffix}")
            point = replace(plan, config=cfg, cluster=replace(plan.cluster, iteration_log=log))
            out = dirs[i] if dirs else None
            _replay(point, options, requests, [r.output_len for r in rows], out, summaries, watch)
        return 0
    except LiveError as err:
        print(f"sangam: error: {err}", file=sys.stderr)
        return 1


@contextmanager
def _running(plan: LivePlan, args: LiveOptions) -> Iterator[tuple[LocalCluster, ClusterStatus]]:
    """A started cluster, stopped on the way out; its logs are kept only if something failed. A call to
    the scheduler that fails (a live but unresponsive scheduler) ends the run as a LiveError."""
    from executor.control.client import SangamError

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


def _replay(
    plan: LivePlan,
    args: LiveOptions,
    requests: list[Request],
    output_lens: list[int],
    out: Path | None,
    summaries: list[dict[str, Any]],
    watch: Watcher | None = None,
) -> None:
    """Replay one point; its summary joins `summaries`, whose table is printed, and its results go to
    `out`, before a failed request or a page leak is raised. An abnormal end (the scheduler or the
    cluster failing, no progress, SIGTERM, Ctrl-C) first writes what finished to `out`, marked partial."""
    from executor.control.client import SangamError
    from runs.report import print_sim_table

    started = time.monotonic()
    ids: dict[int, int] = {}
    with _running(plan, args) as (cluster, status):
        assert cluster.client is not None
        print(
            f"sangam live: {plural(len(plan.devices), 'worker')} ({plan.model} on "
            f"{', '.join(sorted(set(plan.devices)))}) ready in {time.monotonic() - started:.1f} s; "
            f"replaying {plural(len(requests), 'request')} at {plan.config.qps:g} QPS",
            file=sys.stderr,
        )
        collector = Collector(cluster.client)
        tally = LiveTally(cluster.client, watch, len(requests)) if watch is not None else None

        def poll() -> None:
            if out is not None:  # kept for partial results
                collector.poll()
            if tally is not None:
                tally.poll()

        try:
            facts = ready_facts(status)
            replay(cluster, plan, requests, facts.vocab, facts.mask_id, poll, ids)
            wait_for_all(cluster, len(requests), args.stall_timeout, poll)
            if tally is not None:
                tally.poll(final=True)
            final = settle(cluster, SETTLE_S)
            collector.fetch()
        except (LiveError, SangamError, KeyboardInterrupt) as err:
            if out is not None:
                with suppress(SangamError):  # the scheduler may be gone: keep what came before
                    collector.fetch()
                _write_partial(
                    plan, collector, ids, output_lens, len(requests), out, _cause(cluster, err), started
                )
            raise
        done = {r.id for r in collector.records}
        failed = [cluster.client.poll(rid) for rid in ids if rid not in done]
    finished = rebuild(collector.records, ids, output_lens, final.first_arrival)
    if not finished:
        reason = failed[0].error if failed else "no request finished"
        raise LiveError(f"all {len(requests)} requests failed: {reason}")
    summary = _summary(plan, finished, final, started)
    summary.update(partial=False, failed=len(failed), unfinished=0)
    if out is not None:
        write_results(out, finished, summary)
    summaries.append(summary)
    print_sim_table(summaries, title="sangam live")
    if failed:
        raise LiveError(f"{len(failed)} of {len(requests)} requests failed: {failed[0].error}")
    unbalanced = page_leaks(final)
    if unbalanced:
        raise LiveError(f"KV pages not returned at the end: {unbalanced}")


def _summary(
    plan: LivePlan, finished: list[Request], status: ClusterStatus, started: float
) -> dict[str, Any]:
    """The summary of a live run: the simulator's statistics and recovery counts, and the live facts."""
    from runs.build import build
    from runs.results import request_row, summarize

    kv_bytes = plan.config.kv_bytes_per_token
    summary = summarize([request_row(r) for r in finished], kv_bytes, status.recovery)
    summary.update(
        finished=len(finished),
        live_wall_s=time.monotonic() - started,
        live_iterations=status.iterations,
        live_workers=[
            {
                "worker": w.worker_id,
                "role": w.role,
                "pages": w.pages,
                "free_pages_at_end": w.free_pages,
                "lost": w.lost,
            }
            for w in status.workers
        ],
        build=build(),
        config=plan.resolved(),
    )
    if plan.config.layout.kind is not Kind.COLOCATED:
        summary.update(
            kv_transfers_done=status.transfers_done,
            kv_transfers_failed=status.transfers_failed,
            kv_transfer_retries=status.transfer_retries,
        )
    return summary


def _cause(cluster: LocalCluster, err: BaseException) -> str:
    """What ended a run, in one line: a failed call's better reason is a process that died."""
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (SIGTERM or Ctrl-C)"
    if not isinstance(err, LiveError):
        try:
            cluster.check()
        except LiveError as died:
            return str(died)
    return str(err)


def _write_partial(
    plan: LivePlan,
    collector: Collector,
    ids: dict[int, int],
    output_lens: list[int],
    total: int,
    out: Path,
    cause: str,
    started: float,
) -> None:
    """The results of a run that ended abnormally: every request finished before the end, and a summary
    with `"partial": true`, its cause and the counts of finished, failed and unfinished requests."""
    from executor.control.codec import empty_status

    status = collector.status or empty_status()
    finished = rebuild(collector.records, ids, output_lens, collector.origin)
    summary = _summary(plan, finished, status, started)
    failed = status.errors
    summary.update(
        partial=True, partial_cause=cause, failed=failed, unfinished=max(0, total - len(finished) - failed)
    )
    write_results(out, finished, summary)
    print(f"sangam live: the {plural(len(finished), 'request')} finished before the end are in {out}",
          file=sys.stderr)  # fmt: skip


def write_served(
    plan: LivePlan,
    collected: Collector,
    out: Path,
    cause: str | None = None,
    server: dict[str, Any] | None = None,
) -> int:
    """Write the results of every request a serving cluster finished (as `collected` so far) to `out`,
    marked partial with its `cause` if the server did not end normally; how many there were. The
    summary's config is what served (`LivePlan.served`) and the `server`'s own facts."""
    from runs.build import build
    from runs.results import request_row, summarize, write_results

    finished = rebuild(collected.records, {}, [], collected.origin)
    if finished:
        recovery = collected.status.recovery if collected.status is not None else None
        kv_bytes = plan.config.kv_bytes_per_token
        summary = summarize([request_row(r) for r in finished], kv_bytes, recovery)
        summary.update(build=build(), config={**plan.served(collected.status), **(server or {})})
        summary.update(partial=cause is not None, **({"partial_cause": cause} if cause else {}))
        write_results(out, finished, summary)
    return len(finished)


def _serve(plan: LivePlan, args: LiveOptions, files: RunFiles) -> int:
    with _running(plan, args) as (cluster, status):
        assert cluster.client is not None
        print(
            f"sangam live: serving {plan.model} on {cluster.address}"
            f"{' (api key required)' if plan.cluster.api_key else ''} with {len(plan.devices)} workers "
            f"(mask buffer {status.mask_len}, {ready_facts(status).pages} KV pages each; logs in "
            f"{cluster.log_dir}); "
            "Ctrl-C to stop",
            flush=True,
        )
        try:
            while True:
                cluster.check()
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        if files.out:
            collected = Collector(cluster.client)
            collected.fetch()
            write_served(plan, collected, files.out)
    print("sangam live: stopped", file=sys.stderr)
    return 0


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
