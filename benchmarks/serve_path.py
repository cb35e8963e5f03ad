"""Where a request's time goes outside the model: one request at a time through `sangam serve`'s
`/v1/completions` (streamed), alternating with the same request sent straight to its scheduler over gRPC
(`executor.control.client.AsyncSangamClient`, what serve's backend does), on the tiny CPU model.

Run: python -m benchmarks.serve_path [--requests 40] [--out FILE] [-- SERVE ARGS]

The HTTP client is `benchmarks.http_stream`'s, whose own cost is a fraction of a millisecond.

Every request is one block of one forward, so the model's share is small and nothing queues. The
scheduler's state of each request, polled after it ended, gives two instants in the machine's monotonic
clock, which every process shares: its arrival (when the scheduler recorded the Submit) and its end (when
the worker finished its last block). Per request:

- `submit_ms`: the client's send to the arrival (HTTP: the POST, its parsing and checks, then Submit);
- `reply_ms` (HTTP only): the arrival to the response's headers, i.e. Submit's reply and the stream's
  start;
- `deliver_ms`: the end to the client's last event (HTTP: `[DONE]`; gRPC: the DONE state): the worker's
  report, the scheduler's publish and stream, and for HTTP the app's chunk and the SSE write;
- `total_ms`: the client's end-to-end latency minus the scheduler's (end minus arrival).

Medians and p90s of each go to stdout (and FILE as JSON), with the machine's load average and the CPU
time the `sangam serve` process (the HTTP path; the scheduler and workers are its children) spent per
HTTP request, which a shared machine's load inflates less than it does latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.http_stream import Client
from benchmarks.serve_bench import wait_healthy
from executor.control.client import AsyncSangamClient
from executor.control.messages import Submission
from executor.run.ports import free_port
from runs.args import positive_int
from sangam.hardware import BLOCK

STARTUP_S = 300.0
PROMPT = tuple(range(1, 201))  # 200 ids below the tiny models' EOS and mask ids
PAUSE_S = 0.05  # after every request, so that neither path starts on a machine still busy with the other


async def one_http(http: Client, grpc: AsyncSangamClient) -> dict[str, float]:
    body = {"prompt": list(PROMPT), "max_tokens": BLOCK, "stream": True, "forwards_per_block": 1,
            "ignore_eos": True}  # fmt: skip
    start = time.monotonic()
    response = await http.post("/v1/completions", body)
    headers = time.monotonic()
    if response.status != 200:
        raise SystemExit(f"serve_path: HTTP {response.status}: {await response.text()}")
    rid = int(response.headers["x-sangam-request-id"])
    done = float("nan")
    async for line in response.lines():
        if line == "data: [DONE]":
            done = time.monotonic()
    state = await grpc.poll(rid)
    return {
        "submit_ms": (state.arrival - start) * 1e3,
        "reply_ms": (headers - state.arrival) * 1e3,
        "deliver_ms": (done - state.end) * 1e3,
        "total_ms": ((done - start) - (state.end - state.arrival)) * 1e3,
    }


async def one_grpc(grpc: AsyncSangamClient) -> dict[str, float]:
    start = time.monotonic()
    first = await grpc.submit(Submission(PROMPT, BLOCK, forwards=(1,)))
    async for update in grpc.stream(first.request_id):
        if update.finished:
            break
    done = time.monotonic()
    state = await grpc.poll(first.request_id)
    return {
        "submit_ms": (state.arrival - start) * 1e3,
        "deliver_ms": (done - state.end) * 1e3,
        "total_ms": ((done - start) - (state.end - state.arrival)) * 1e3,
    }


async def drive(url: str, address: str, requests: int) -> dict[str, list[dict[str, float]]]:
    grpc = AsyncSangamClient(address)
    http = Client(url)
    runs: dict[str, list[dict[str, float]]] = {"http": [], "grpc": []}
    try:
        for i in range(requests + 2):  # the first two of each warm the connections up
            h = await one_http(http, grpc)
            await asyncio.sleep(PAUSE_S)
            g = await one_grpc(grpc)
            await asyncio.sleep(PAUSE_S)
            if i >= 2:
                runs["http"].append(h)
                runs["grpc"].append(g)
    finally:
        http.close()
        await grpc.close()
    return runs


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    out = {}
    for key in runs[0]:
        values = sorted(r[key] for r in runs)
        out[f"{key}_median"] = statistics.median(values)
        out[f"{key}_p90"] = values[int(0.9 * (len(values) - 1))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=positive_int, default=40, help="per path")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    parser.add_argument("extra", nargs="*", help="after --: arguments for sangam serve")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="serve-path-"))
    port = free_port()
    command = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--mask-len", "256",
               "--log-dir", str(logs), *(args.extra or ["--workers", "1"])]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url, STARTUP_S, "serve_path")
        address = json.loads((logs / "scheduler.json").read_text())["address"]
        load_before, cpu_before = os.getloadavg()[0], cpu_seconds(server.pid)
        runs = asyncio.run(drive(url, address, args.requests))
        load_after, cpu = os.getloadavg()[0], cpu_seconds(server.pid) - cpu_before
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    report = {
        "requests": args.requests,
        "load_average": [load_before, load_after],
        "http": summary(runs["http"]),
        "serve_cpu_ms_per_request": cpu * 1e3 / (args.requests + 2),
        "grpc": summary(runs["grpc"]),
    }
    for path in ("http", "grpc"):
        figures = ", ".join(f"{k} {v:.2f}" for k, v in report[path].items())
        print(f"{path:>5}: {figures}")
    print(f"sangam serve's CPU per HTTP request: {report['serve_cpu_ms_per_request']:.2f} ms")
    print(f"load average {load_before:.1f} -> {load_after:.1f}")
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
