"""What the HTTP path costs: one open-loop Poisson trace (ShareGPT-like lengths) replayed through
`sangam live` and then sent through `sangam serve`'s `/v1/completions` (streamed), on the same machine.
The HTTP client is `benchmarks.http_stream`'s, whose own cost is a fraction of a millisecond (httpx's was
about 4 ms per request on the project's CPU machine).

Run: python -m benchmarks.serve_bench [--num-prompts 32] [--request-rate 1] [--out DIR] [-- SERVE ARGS]

Both runs do the same work: every block takes `--forwards` forwards (`sangam live --progress fixed:D`;
`forwards_per_block` and `ignore_eos` over HTTP), so a request runs exactly its output length. The
HTTP run writes `vllm bench serve`'s result keys (`completed`, `failed`, `request_throughput`,
`output_throughput`, `mean_e2el_ms`, `median_e2el_ms`, `p99_e2el_ms`, TTFT as the first block's chunk)
to DIR/serve_bench.json, with two measures of the HTTP overhead:

- `http_overhead_median_ms` (and `_p99_`): per request, the client's end-to-end latency minus the
  scheduler's own for the same request (matched by the `x-sangam-request-id` header against the
  server's `--out` requests.csv): tokenization, HTTP, Submit and the stream's delivery;
- `grpc_overhead_median_ms`: the same for the trace sent a second time to the same server's scheduler
  straight over gRPC (`executor.control.client.AsyncSangamClient`, what serve's backend does): the control
  plane's share (the worker's report, the scheduler's publish, the stream), so that
  `http_minus_grpc_overhead_median_ms` is what HTTP itself adds;
- `http_overhead_mean_pct`: the mean of the first measure as a share of the HTTP run's mean end-to-end
  latency (what the HTTP path, Submit and delivery add to the mean, request by request);
- `median_e2el_vs_live_ms`, `mean_e2el_vs_live_pct`: the HTTP run's median and mean end-to-end latency
  against the `sangam live` replay's, and `mean_e2el_vs_grpc_pct` against the gRPC run's on the same
  server (separate runs of one trace: they also hold run-to-run noise, the batches a request shares
  changing with the instants the requests arrive at).

Target (issue 16): the HTTP path adds at most 2 ms per request at the median. Without a GPU the serve
and live processes run the tiny CPU model (`--workers 1`); extra arguments after `--` go to both
commands (e.g. `-- --gpus 1` on a GPU machine).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.http_stream import Client
from executor.control.client import AsyncSangamClient, SangamError
from executor.control.messages import Submission
from executor.run.ports import free_port
from runs.args import positive_float, positive_int
from sangam.hardware import BLOCK
from sangam.workload import TraceRow, sample_lengths, with_arrivals

TINY_EOS = 298  # prompt ids lie below the tiny models' EOS and mask ids
STARTUP_S = 600.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the client saw it."""

    ok: bool
    request_id: int | None
    prompt_len: int
    output_tokens: int
    start: float
    first_chunk: float | None
    end: float
    error: str = ""


def trace(n: int, qps: float, seed: int, max_prompt: int, mask_len: int) -> list[tuple[float, int, int]]:
    """(arrival s, prompt_len, output_len) rows: ShareGPT-like lengths cut to the server's limits."""
    pairs = sample_lengths("sharegpt", n, random.Random(seed))
    rows = [TraceRow(min(prompt, max_prompt), min(output, mask_len)) for prompt, output in pairs]
    timed = with_arrivals(rows, qps, random.Random(f"{seed}:arrivals"), None)
    return [(r.arrival_time or 0.0, r.prompt_len, r.output_len) for r in timed]


def write_trace(path: Path, rows: list[tuple[float, int, int]]) -> None:
    """The rows as a trace file whose max_tokens is each output length, as the HTTP run asks: the
    replay then sizes each request's mask buffer as the server does."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["arrival_time", "prompt_len", "output_len", "max_tokens"])
        out.writerows([f"{a:.6f}", p, o, o] for a, p, o in rows)


def sangam(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def run_live(trace_file: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`sangam live` over the trace; its summary.json."""
    command = sangam(
        "live", "--trace", str(trace_file), "--num-requests", str(args.num_prompts),
        "--progress", f"fixed:{args.forwards}", "--out", str(out),
        "--mask-len", str(args.mask_len), *args.extra,
    )  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


async def send(client: Client, row: tuple[float, int, int], t0: float, args: argparse.Namespace) -> Sent:
    arrival, prompt_len, output_len = row
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    body = {
        "prompt": prompt_of(row, args.seed),
        "max_tokens": output_len, "stream": True, "forwards_per_block": args.forwards, "ignore_eos": True,
    }  # fmt: skip
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    error = ""
    try:
        response = await client.post("/v1/completions", body)
        if response.status != 200:
            text = await response.text()
            return Sent(False, None, prompt_len, 0, start, None, time.perf_counter(), text[:200])
        rid = int(response.headers["x-sangam-request-id"])
        async for line in response.lines():
            if not line.startswith("data: ") or line == "data: [DONE]" or error:
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                error = str(chunk["error"])
                continue
            first = first if first is not None else time.perf_counter()
            tokens = min(output_len, tokens + BLOCK)
    except (OSError, asyncio.IncompleteReadError) as err:
        return Sent(False, None, prompt_len, 0, start, first, time.perf_counter(), str(err))
    if error:
        return Sent(False, rid, prompt_len, 0, start, first, time.perf_counter(), error)
    return Sent(True, rid, prompt_len, tokens, start, first, time.perf_counter())


def prompt_of(row: tuple[float, int, int], seed: int) -> list[int]:
    rng = random.Random(f"{seed}:{row[0]}")
    return [rng.randrange(TINY_EOS) for _ in range(row[1])]


async def send_grpc(
    client: AsyncSangamClient, row: tuple[float, int, int], t0: float, args: argparse.Namespace
) -> Sent:
    """The same request straight to the scheduler's client port (what serve's backend does)."""
    arrival, prompt_len, output_len = row
    await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
    n_blocks = -(-output_len // BLOCK)
    start = time.perf_counter()
    try:
        first = await client.submit(
            Submission(
                tuple(prompt_of(row, args.seed)), BLOCK * n_blocks, forwards=(args.forwards,) * n_blocks
            )
        )
        async for update in client.stream(first.request_id):
            if update.finished:
                ok = update.status == "DONE"
                return Sent(
                    ok,
                    first.request_id,
                    prompt_len,
                    output_len if ok else 0,
                    start,
                    None,
                    time.perf_counter(),
                    update.error,
                )
    except SangamError as err:
        return Sent(False, None, prompt_len, 0, start, None, time.perf_counter(), str(err))
    return Sent(
        False, first.request_id, prompt_len, 0, start, None, time.perf_counter(), "stream ended early"
    )


async def drive_grpc(
    address: str, rows: list[tuple[float, int, int]], args: argparse.Namespace
) -> list[Sent]:
    client = AsyncSangamClient(address)
    try:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(send_grpc(client, row, t0, args) for row in rows)))
    finally:
        await client.close()


async def drive(url: str, rows: list[tuple[float, int, int]], args: argparse.Namespace) -> list[Sent]:
    client = Client(url)
    try:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(send(client, row, t0, args) for row in rows)))
    finally:
        client.close()


def run_serve(
    rows: list[tuple[float, int, int]], out: Path, args: argparse.Namespace
) -> tuple[list[Sent], float, list[Sent]]:
    """`sangam serve` with the trace sent through HTTP, then again straight to its scheduler's gRPC
    client port; what the clients saw, and the HTTP pass's wall seconds."""
    port = free_port()
    command = sangam(
        "serve", "--port", str(port), "--out", str(out), "--mask-len", str(args.mask_len),
        "--max-waiting", str(len(rows) + 1), "--log-dir", str(out / "logs"), *args.extra,
    )  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, STARTUP_S, "serve_bench")
        started = time.perf_counter()
        sent = asyncio.run(drive(url, rows, args))
        wall = time.perf_counter() - started
        address = json.loads((out / "logs" / "scheduler.json").read_text())["address"]
        direct = asyncio.run(drive_grpc(address, rows, args))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    return sent, wall, direct


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stats(prefix: str, values_ms: list[float]) -> dict[str, float]:
    return {
        f"mean_{prefix}_ms": statistics.fmean(values_ms) if values_ms else float("nan"),
        f"median_{prefix}_ms": percentile(values_ms, 50),
        f"std_{prefix}_ms": statistics.pstdev(values_ms) if values_ms else float("nan"),
        f"p99_{prefix}_ms": percentile(values_ms, 99),
    }


def paired_overhead(sent: list[Sent], scheduler_e2el: dict[int, float]) -> list[float]:
    """Per finished request: the client's end-to-end ms minus the scheduler's own for it."""
    return [
        (s.end - s.start) * 1e3 - scheduler_e2el[s.request_id]
        for s in sent
        if s.ok and s.request_id in scheduler_e2el
    ]


def result(
    sent: list[Sent],
    wall: float,
    direct: list[Sent],
    live: dict[str, Any],
    served: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    done = [s for s in sent if s.ok]
    e2el = [(s.end - s.start) * 1e3 for s in done]
    grpc_e2el = [(s.end - s.start) * 1e3 for s in direct if s.ok]
    ttft = [(s.first_chunk - s.start) * 1e3 for s in done if s.first_chunk is not None]
    with (served / "requests.csv").open() as f:
        scheduler_e2el = {int(r["request_id"]): float(r["e2el"]) * 1e3 for r in csv.DictReader(f)}
    overhead = paired_overhead(sent, scheduler_e2el)
    grpc_overhead = paired_overhead(direct, scheduler_e2el)
    out_tokens = sum(s.output_tokens for s in done)
    in_tokens = sum(s.prompt_len for s in done)
    return {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": "sangam-serve",
        "endpoint": "/v1/completions",
        "num_prompts": len(sent),
        "request_rate": args.request_rate,
        "forwards_per_block": args.forwards,
        "duration": wall,
        "completed": len(done),
        "failed": len(sent) - len(done),
        "errors": sorted({s.error for s in sent if not s.ok})[:5],
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / wall,
        "output_throughput": out_tokens / wall,
        "total_token_throughput": (in_tokens + out_tokens) / wall,
        **stats("e2el", e2el),
        **stats("ttft", ttft),
        "http_overhead_median_ms": percentile(overhead, 50),
        "http_overhead_p99_ms": percentile(overhead, 99),
        "http_overhead_matched": len(overhead),
        "grpc_overhead_median_ms": percentile(grpc_overhead, 50),
        "grpc_overhead_p99_ms": percentile(grpc_overhead, 99),
        "grpc_completed": sum(s.ok for s in direct),
        "grpc_mean_e2el_ms": statistics.fmean(grpc_e2el) if grpc_e2el else float("nan"),
        "http_overhead_mean_pct": 100 * statistics.fmean(overhead) / statistics.fmean(e2el),
        "http_minus_grpc_overhead_median_ms": percentile(overhead, 50) - percentile(grpc_overhead, 50),
        "live_median_e2el_ms": live["median_e2el_ms"],
        "live_mean_e2el_ms": live["mean_e2el_ms"],
        "median_e2el_vs_live_ms": percentile(e2el, 50) - live["median_e2el_ms"],
        "mean_e2el_vs_live_pct": 100 * (statistics.fmean(e2el) / live["mean_e2el_ms"] - 1),
        "mean_e2el_vs_grpc_pct": 100 * (statistics.fmean(e2el) / statistics.fmean(grpc_e2el) - 1),
        "extra_args": args.extra,
    }


def wait_healthy(server: subprocess.Popen[bytes], url: str, timeout: float, name: str) -> None:
    """Until `sangam serve` at `url` answers /health with 200; SystemExit (naming `name`) if it exits
    first or takes longer than `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise SystemExit(f"{name}: sangam serve exited with status {server.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: sangam serve did not get ready")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-prompts", type=positive_int, default=32)
    parser.add_argument("--request-rate", type=positive_float, default=1.0)
    parser.add_argument("--forwards", type=positive_int, default=8, help="forwards per block, 1..32")
    parser.add_argument("--mask-len", type=positive_int, default=1024)
    parser.add_argument("--max-prompt", type=positive_int, default=2048, help="prompt tokens at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' files here")
    parser.add_argument("extra", nargs="*", help="after --: arguments for both sangam live and sangam serve")
    args = parser.parse_args()
    if not 1 <= args.forwards <= BLOCK:
        parser.error(f"--forwards must lie in [1, {BLOCK}]")
    if not args.extra:
        args.extra = ["--workers", "1"]
    out = args.out or Path(tempfile.mkdtemp(prefix="serve-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = trace(args.num_prompts, args.request_rate, args.seed, args.max_prompt, args.mask_len)
    write_trace(out / "trace.csv", rows)
    live = run_live(out / "trace.csv", out / "live", args)
    sent, wall, direct = run_serve(rows, out / "serve", args)
    report = result(sent, wall, direct, live, out / "serve", args)
    (out / "serve_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    keys = (
        "completed", "failed", "request_throughput", "output_throughput", "median_e2el_ms", "p99_e2el_ms",
        "live_median_e2el_ms", "median_e2el_vs_live_ms", "mean_e2el_ms", "live_mean_e2el_ms",
        "grpc_mean_e2el_ms", "mean_e2el_vs_live_pct", "mean_e2el_vs_grpc_pct", "http_overhead_median_ms",
        "http_overhead_p99_ms", "http_overhead_mean_pct", "grpc_overhead_median_ms",
        "http_minus_grpc_overhead_median_ms",
    )  # fmt: skip
    for key in keys:
        value = report[key]
        print(f"{key:>26}: {value:.2f}" if isinstance(value, float) else f"{key:>26}: {value}")
    print(f"{'results':>26}: {out / 'serve_bench.json'}")


if __name__ == "__main__":
    main()
