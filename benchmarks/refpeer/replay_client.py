"""Replay a trace file through the reference implementation's server (its SchedulerService.Generate), open
loop: each request is sent at its arrival time from its own thread, and submit -> done is recorded.

Runs in the reference's process (PYTHONPATH=<reference>/src:benchmarks/refpeer/shim), with its generated
stubs. Every request asks for the `conf_quota` sampler committing `--quota` tokens per forward at
temperature 0, so each 32-token block takes 32/quota forwards (the prefill's unmasking step included), as
`sangam live --progress fixed:D` forces on ours. Prompts are random token ids (the server does no
tokenization), seeded per request.

    python3 benchmarks/refpeer/replay_client.py --trace trace-qps0.5.csv --port 50051 --quota 4 \
        --json ref-qps0.5.json --wait-ready 400 --warmup 2
    python3 benchmarks/refpeer/replay_client.py --trace trace-qps0.5.csv --quota 4 --dry-run

The JSON holds one row per request: arrival (the trace's), sent and done (client clock, seconds from the
replay's start), e2el_client (done - sent), the server's own arrival, start and complete times and
e2el_server (complete - arrival), its status and forwards. `--dry-run` builds every message and exits
without a network.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from refpath import require_reference

BLOCK = 32
MAX_MESSAGE = 64 * 2**20  # the reference's own cap (sangam.grpc_utils)
TOKEN_RANGE = 126000  # prompt ids below LLaDA's special tokens (mask 126336, eos 126081)


def read_trace(path: Path) -> list[dict[str, float]]:
    """Rows of arrival_time, prompt_len, output_len, in file order."""
    with path.open(newline="") as f:
        rows = [
            {
                "arrival": float(r["arrival_time"]),
                "prompt_len": int(r["prompt_len"]),
                "output_len": int(r["output_len"]),
            }
            for r in csv.DictReader(f)
        ]
    if not rows:
        raise SystemExit(f"error: {path}: no requests")
    return rows


def build_request(pb2: Any, index: int, row: dict[str, float], quota: int, seed: int) -> Any:
    """The GenerateRequest of trace row `index`."""
    rng = random.Random(f"{seed}:{index}")
    prompt = [rng.randrange(TOKEN_RANGE) for _ in range(int(row["prompt_len"]))]
    return pb2.GenerateRequest(
        prompt_token_ids=prompt,
        gen_length=int(row["output_len"]),
        request_seed=seed * 1_000_003 + index,
        sampling_parameters=pb2.SamplingParameters(
            temperature=0.0, unmasking_strategy="conf_quota", fixed_unmask_quota=quota
        ),
    )


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_ready(stub: Any, pb2: Any, timeout: float, watch_pid: int | None = None) -> float:
    """Seconds until GetSchedulerStatus says ready with a colocated worker; exits on timeout, or as soon
    as process `watch_pid` (the reference's launcher) is gone."""
    import grpc

    t0 = time.monotonic()
    last = "no answer"
    while time.monotonic() - t0 < timeout:
        if watch_pid is not None and not alive(watch_pid):
            raise SystemExit(f"error: the reference's launcher (pid {watch_pid}) exited before it was ready")
        try:
            status = stub.GetSchedulerStatus(pb2.GetSchedulerStatusRequest(), timeout=5)
            last = f"{status.num_colocated_workers} colocated workers, ready={status.ready_for_requests}"
            if status.ready_for_requests and status.num_colocated_workers > 0:
                return time.monotonic() - t0
        except grpc.RpcError as err:
            last = f"{err.code().name}"
        time.sleep(2.0)
    raise SystemExit(f"error: the reference's scheduler was not ready after {timeout:.0f} s ({last})")


def replay(stub: Any, requests: list[Any], rows: list[dict[str, float]], timeout: float) -> list[dict]:
    """Send each request at its arrival time from its own thread; one result row per request."""
    results: list[dict[str, Any]] = [{} for _ in rows]
    start = time.monotonic()

    def one(i: int) -> None:
        delay = start + rows[i]["arrival"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sent = time.monotonic() - start
        row: dict[str, Any] = {"id": i, **rows[i], "sent": sent}
        try:
            reply = stub.Generate(requests[i], timeout=timeout)
            row.update(
                status=reply.status or "NO_REPLY",
                forwards=reply.num_forward_evals,
                error=reply.error_message,
                server_arrival=reply.server_arrival_time,
                server_start=reply.server_start_time,
                server_complete=reply.server_complete_time,
                e2el_server=reply.server_complete_time - reply.server_arrival_time,
            )
        except Exception as err:  # a failed call is one failed row, not a lost replay
            row.update(status="RPC_ERROR", error=str(err).splitlines()[0][:200])
        row["done"] = time.monotonic() - start
        row["e2el_client"] = row["done"] - sent
        results[i] = row

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="CSV: arrival_time, prompt_len, output_len")
    parser.add_argument("--port", type=int, default=50051, help="the scheduler's client port")
    parser.add_argument("--quota", type=int, required=True, help="conf_quota tokens committed per forward")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random prompts")
    parser.add_argument("--json", type=Path, help="results file")
    parser.add_argument("--wait-ready", type=float, default=0.0, metavar="S", help="wait up to S s first")
    parser.add_argument("--watch-pid", type=int, help="stop waiting when this process (the launcher) ends")
    parser.add_argument("--warmup", type=int, default=0, help="requests sent one by one before the replay")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per Generate call")
    parser.add_argument("--dry-run", action="store_true", help="build the messages, send nothing")
    args = parser.parse_args(argv)
    if args.quota <= 0 or BLOCK % args.quota:
        raise SystemExit(f"error: --quota must divide {BLOCK}, got {args.quota}")
    require_reference()
    from sangam.proto import sangam_pb2 as pb2
    from sangam.proto import sangam_pb2_grpc as pb2_grpc

    rows = read_trace(args.trace)
    requests = [build_request(pb2, i, row, args.quota, args.seed) for i, row in enumerate(rows)]
    if args.dry_run:
        size = sum(r.ByteSize() for r in requests)
        first = requests[0]
        print(
            f"dry run: {len(requests)} GenerateRequests, {size} bytes; first: {len(first.prompt_token_ids)} "
            f"prompt tokens, gen_length {first.gen_length}, {first.sampling_parameters.unmasking_strategy} "
            f"quota {first.sampling_parameters.fixed_unmask_quota}"
        )
        return 0
    import grpc

    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    channel = grpc.insecure_channel(f"127.0.0.1:{args.port}", options=options)
    stub = pb2_grpc.SchedulerServiceStub(channel)
    ready_s = wait_ready(stub, pb2, args.wait_ready, args.watch_pid) if args.wait_ready else None
    if ready_s is not None:
        print(f"reference ready after {ready_s:.1f} s of waiting", flush=True)
    warm = {"prompt_len": 256, "output_len": 64, "arrival": 0.0}
    for i in range(args.warmup):
        t0 = time.monotonic()
        reply = stub.Generate(build_request(pb2, -1 - i, warm, args.quota, args.seed), timeout=args.timeout)
        print(f"warm-up {i}: {reply.status} in {time.monotonic() - t0:.2f} s", flush=True)
    t0 = time.monotonic()
    results = replay(stub, requests, rows, args.timeout)
    wall = time.monotonic() - t0
    ok = [r for r in results if r["status"] == "COMPLETED"]
    per_block = BLOCK // args.quota
    forced = sum(r["forwards"] == -(-int(r["output_len"]) // BLOCK) * per_block for r in ok)
    summary = {
        "trace": str(args.trace),
        "quota": args.quota,
        "forwards_per_block": per_block,
        "requests": len(results),
        "completed": len(ok),
        "forwards_as_forced": forced,
        "warmup": args.warmup,
        "wall_s": wall,
        "rows": results,
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    mean = sum(r["e2el_server"] for r in ok) / len(ok) if ok else float("nan")
    print(
        f"replayed {len(results)} requests in {wall:.1f} s: {len(ok)} completed, {forced} with "
        f"{per_block} forwards per block; mean e2e (server) {mean:.3f} s",
        flush=True,
    )
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
