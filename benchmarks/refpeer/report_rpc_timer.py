"""Time the reference implementation's per-iteration report, `SchedulerWorkerService.ReportBatchMetrics`,
per batch size: the worker builds its `Batch` (one `BatchRequestUpdate` per request, each carrying the
request's full updated sequence), converts it with `to_proto()` and sends it synchronously before its
next iteration; the scheduler's handler only queues it. Here a servicer that acknowledges as that handler
does runs in a child process on the reference's own server factory (`sangam.engine.grpc_server`), and the
caller times build + `to_proto` + the blocking call, median over --iters after --warmup.

Runs in the reference's process (PYTHONPATH=<reference>/src:benchmarks/refpeer/shim), CPU only:

    python3 benchmarks/refpeer/report_rpc_timer.py --batch-sizes 1,2,4,8,16,32,64 --seq-lens 1024,1536 \
        --json rpc.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from refpath import require_reference

MAX_MESSAGE = 64 * 2**20


def serve(port_out: Any, stop: Any) -> None:
    """The acknowledging servicer, on an ephemeral port sent back through `port_out`."""
    from sangam.engine.grpc_server import create_server
    from sangam.proto import sangam_pb2, sangam_pb2_grpc

    class Ack(sangam_pb2_grpc.SchedulerWorkerServiceServicer):
        def __init__(self) -> None:
            self.reports: list[Any] = []

        def ReportBatchMetrics(self, request: Any, context: Any) -> Any:
            self.reports.append(request)  # the real handler queues the report for its event loop
            del self.reports[:-4]
            return sangam_pb2.BatchMetricsAck(success=True)

    server = create_server(64, MAX_MESSAGE)  # the scheduler's worker-callback server has 64 threads
    sangam_pb2_grpc.add_SchedulerWorkerServiceServicer_to_server(Ack(), server)
    port_out.send(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(0)


def batch(size: int, seq_len: int, rng: random.Random) -> Any:
    """A decode batch of `size` requests whose sequences are `seq_len` tokens, as the worker reports it."""
    from sangam.batch import Batch, BatchRequestUpdate
    from sangam.proto import sangam_pb2

    updates = [
        BatchRequestUpdate(
            request_id=f"req-{i:06d}",
            block_index=3,
            success=True,
            updated_sequence=[rng.randrange(126000) for _ in range(seq_len)],
            num_unmasked_tokens=4,
            num_forward_evals_in_batch_phase=2,
            request_phase=sangam_pb2.BATCH_PHASE_DECODE,
            decode_duration=0.01,
        )
        for i in range(size)
    ]
    state = sangam_pb2.WorkerStateSnapshot(
        state=sangam_pb2.WORKER_STATE_BUSY, timestamp=time.time(), active_batch_size=size
    )
    return Batch(
        worker_id="colocated-0",
        worker_type="colocated",
        batch_size=size,
        prompt_len=seq_len - 512,
        gen_len=512,
        batch_start_time=time.time(),
        batch_end_time=time.time(),
        kv_total_pages=8192,
        kv_used_pages=size * (seq_len // 16),
        kv_free_pages=8192 - size * (seq_len // 16),
        num_unmasked_tokens=4 * size,
        batch_phase=sangam_pb2.BATCH_PHASE_DECODE,
        request_updates=updates,
        worker_state_after=state,
    )


def time_one(stub: Any, size: int, seq_len: int, warmup: int, iters: int) -> dict[str, Any]:
    """Median times (ms) of to_proto and of the call, for one batch size and sequence length."""
    rng = random.Random(size * 7919 + seq_len)
    report = batch(size, seq_len, rng)
    build, call = [], []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        message = report.to_proto()
        t1 = time.perf_counter()
        stub.ReportBatchMetrics(message, timeout=30)
        t2 = time.perf_counter()
        if i >= warmup:
            build.append((t1 - t0) * 1000)
            call.append((t2 - t1) * 1000)
    total = [b + c for b, c in zip(build, call, strict=True)]
    return {
        "batch_size": size,
        "seq_len": seq_len,
        "bytes": message.ByteSize(),
        "to_proto_ms": statistics.median(build),
        "rpc_ms": statistics.median(call),
        "total_ms": statistics.median(total),
        "total_p90_ms": sorted(total)[int(0.9 * (len(total) - 1))],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--seq-lens", default="1024,1536", help="tokens per request's sequence")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    require_reference()
    import grpc
    from sangam.proto import sangam_pb2_grpc

    ctx = mp.get_context("spawn")
    port_recv, port_send = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    server = ctx.Process(target=serve, args=(port_send, stop), daemon=True)
    server.start()
    if not port_recv.poll(60):
        raise SystemExit("error: the stub scheduler did not start in 60 s")
    port = port_recv.recv()
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    stub = sangam_pb2_grpc.SchedulerWorkerServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    )
    rows = []
    try:
        for seq_len in (int(x) for x in args.seq_lens.split(",")):
            for size in (int(x) for x in args.batch_sizes.split(",")):
                row = time_one(stub, size, seq_len, args.warmup, args.iters)
                rows.append(row)
                print(
                    f"B={size:3d} L={seq_len}: {row['bytes'] / 1024:8.1f} KiB, "
                    f"to_proto {row['to_proto_ms']:.3f} ms + call {row['rpc_ms']:.3f} ms "
                    f"= {row['total_ms']:.3f} ms",
                    flush=True,
                )
    finally:
        stop.set()
        server.join(10)
    if args.json:
        args.json.write_text(json.dumps({"iters": args.iters, "warmup": args.warmup, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
