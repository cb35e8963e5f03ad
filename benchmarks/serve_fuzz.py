"""Fuzz beside a steady good load: `sangam serve` under hostile requests from several threads.

Run: python -m benchmarks.serve_fuzz [--seconds 30] [--threads 4] [--rate 2] [--seed 0] [--only NAME...]
     [-- SERVE ARGS]

Starts `sangam serve --workers 1 --mask-len 128` (the tiny CPU model) on a free port, SERVE ARGS added,
its output and process logs kept in a temporary directory, and runs two phases of `--seconds` each:

1. calm: the good load alone: a completion of two blocks of four forwards (`ignore_eos`,
   `forwards_per_block`) started every 1/`--rate` s, open loop;
2. fuzz: the same good load while `--threads` threads send hostile requests back to back, each drawn
   (seeded) from the categories below.

A thread asks `/health` back to back throughout (`serve_hostile.Prober`); the hostile threads run in a
process of their own, so that they do not slow the good load's or `/health`'s client. Prints the hostile
requests' counts by category and answer (the HTTP status; for a raw connection `closed`, `reset` or
`silent` when no status line came back within 15 s) and the slowest answer of each, the 5xx answers, the
tracebacks in the server's logs, the good load's completions and latency (median, p90, max) in each
phase, `/health`'s worst answer time in each phase, the CPU seconds the serve process and its scheduler
and workers used in each, the load average, and the resident memory of the serve process (and of its
scheduler and workers) before and after the fuzz phase.

Categories: the bodies of `serve_hostile` that stalled the server before its bounds (a 1 MB stop string,
100,000 stop strings, 170,000 messages, 300,000 content parts, a 4 MB prompt, 1,000,000 prompt ids, an
8 MB label, 100,000 nested lists); the types OpenAI refuses (`temperature: false`, `max_tokens: true` or
`"1"`, `stream: "yes"`, `prompt: [true]`, a negative `max_completion_tokens` beside `max_tokens`,
`logprobs: 0`, `n: 1000`, `top_p: 2`, a negative temperature, `NaN`, `Infinity`, a huge `max_tokens`, a
lone surrogate, a bad `continuous_usage_stats`); an unknown model; a `tool` message, a null content;
broken JSON (truncated, not JSON, empty, an array, a text/plain body); a path that does not exist and a
method a path does not take; a 64 KB header; a stream the client leaves after its first chunk; and on
raw connections: a client gone mid-body, partial headers (the client gone, or holding the connection
open), a garbage request line, a content-length of 10 GB, and a request trickled a byte every 20 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.serve_bench import wait_healthy
from benchmarks.serve_hostile import STARTUP_S, Prober, bodies
from executor.run.ports import free_port
from runs.args import positive_float, positive_int

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
GOOD = {"prompt": "Hello there", "max_tokens": 64, "ignore_eos": True, "forwards_per_block": 4}
RAW_WAIT_S = 15.0  # a raw connection waits this long for a status line (serve cuts slow headers at 10 s)


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


Case = Callable[[httpx.Client, Target], str]  # sends one hostile request; its answer, as a word


def post(path: str, body: bytes, content_type: str = "application/json") -> Case:
    def send(client: httpx.Client, target: Target) -> str:
        response = client.post(target.url + path, content=body, headers={"content-type": content_type})
        return str(response.status_code)

    return send


def post_json(path: str, body: object) -> Case:
    return post(path, json.dumps(body).encode())


def get(path: str, headers: dict[str, str] | None = None) -> Case:
    def send(client: httpx.Client, target: Target) -> str:
        return str(client.get(target.url + path, headers=headers or {}).status_code)

    return send


def left_mid_stream(client: httpx.Client, target: Target) -> str:
    """A streamed completion the client leaves after its first chunk."""
    body = {**GOOD, "stream": True}
    with client.stream("POST", target.url + COMPLETIONS, json=body) as response:
        for _ in response.iter_bytes():
            break
        return str(response.status_code)


def raw(data: bytes, *, leave: bool = True, trickle_s: float = 0.0) -> Case:
    """`data` on a connection of its own (a byte every `trickle_s` seconds if given), the client then
    leaving (closing its side) if it does; the status line's code, or what became of the connection."""

    def send(client: httpx.Client, target: Target) -> str:
        with socket.create_connection((target.host, target.port), timeout=RAW_WAIT_S) as sock:
            try:
                if trickle_s:
                    for i in range(len(data)):
                        sock.sendall(data[i : i + 1])
                        time.sleep(trickle_s)
                else:
                    sock.sendall(data)
                if leave:
                    sock.shutdown(socket.SHUT_WR)
                head = sock.recv(64)
            except TimeoutError:
                return "silent"
            except ConnectionError:
                return "reset"
        parts = head.split()
        return parts[1].decode(errors="replace") if len(parts) > 1 and head.startswith(b"HTTP/") else "closed"

    return send


def cases() -> dict[str, Case]:
    """Every hostile category by name."""
    hi = {"prompt": "hi", "max_tokens": 32}
    small = json.dumps(hi)
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    heavy = ("stop_1mb", "stops_many", "messages_170k", "parts_300k", "prompt_4mb", "prompt_ids_1m",
             "label_8mb", "nested")  # fmt: skip
    built = bodies()
    out: dict[str, Case] = {name: post(*built[name]) for name in heavy}
    out.update(
        temperature_false=post_json(COMPLETIONS, {**hi, "temperature": False}),
        max_tokens_true=post_json(COMPLETIONS, {**hi, "max_tokens": True}),
        max_tokens_text=post_json(COMPLETIONS, {**hi, "max_tokens": "1"}),
        stream_yes=post_json(COMPLETIONS, {**hi, "stream": "yes"}),
        prompt_bools=post_json(COMPLETIONS, {**hi, "prompt": [True]}),
        max_completion_negative=post_json(COMPLETIONS, {**hi, "max_tokens": 1, "max_completion_tokens": -5}),
        logprobs_zero=post_json(COMPLETIONS, {**hi, "logprobs": 0}),
        n_1000=post_json(COMPLETIONS, {**hi, "n": 1000}),
        top_p_2=post_json(COMPLETIONS, {**hi, "top_p": 2}),
        temperature_negative=post_json(COMPLETIONS, {**hi, "temperature": -1}),
        nan=post(COMPLETIONS, b'{"prompt": "hi", "max_tokens": 32, "temperature": NaN}'),
        infinity=post(COMPLETIONS, b'{"prompt": "hi", "max_tokens": Infinity}'),
        max_tokens_huge=post_json(COMPLETIONS, {**hi, "max_tokens": 10**12}),
        lone_surrogate=post(COMPLETIONS, b'{"prompt": "\\ud800", "max_tokens": 32}'),
        usage_stats_text=post_json(
            COMPLETIONS, {**hi, "stream": True, "stream_options": {"continuous_usage_stats": "yes"}}
        ),
        unknown_model=post_json(COMPLETIONS, {**hi, "model": "gpt-4o"}),
        tool_message=post_json(CHAT, {"messages": [{"role": "tool", "content": "x"}]}),
        null_content=post_json(CHAT, {"messages": [{"role": "user", "content": None}]}),
        truncated_json=post(COMPLETIONS, b'{"prompt": "hi", "max_tok'),
        not_json=post(COMPLETIONS, b"hello"),
        empty_body=post(COMPLETIONS, b""),
        json_array=post(COMPLETIONS, b"[1, 2]"),
        text_plain=post(COMPLETIONS, json.dumps(hi).encode(), "text/plain"),
        no_such_path=get("/v1/nothing"),
        wrong_method=get(COMPLETIONS),
        header_64kb=get("/v1/models", {"x-junk": "j" * 65_536}),
        left_mid_stream=left_mid_stream,
        gone_mid_body=raw((head + 'content-length: 1000\r\n\r\n{"prompt": ').encode()),
        partial_headers=raw(head.encode()),
        held_partial_headers=raw(head.encode(), leave=False),
        garbage_request=raw(b"GARBAGE\r\n\r\n"),
        content_length_10gb=raw((head + 'content-length: 10000000000\r\n\r\n{"prompt"').encode()),
        trickled_request=raw(
            f"{head}content-length: {len(small)}\r\n\r\n{small}".encode(), leave=False, trickle_s=0.02
        ),
    )
    return out


@dataclass(slots=True)
class GoodLoad:
    """Completions started every 1/rate s (open loop); each one's latency, and the failures."""

    target: Target
    rate: float
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, seconds: float) -> None:
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(max_workers=16) as pool:
            start = time.monotonic()
            for i in range(int(seconds * self.rate)):
                time.sleep(max(0.0, start + i / self.rate - time.monotonic()))
                pool.submit(self._one, client)

    def _one(self, client: httpx.Client) -> None:
        start = time.monotonic()
        try:
            answer = str(client.post(self.target.url + COMPLETIONS, json=GOOD).status_code)
        except httpx.HTTPError as err:
            answer = type(err).__name__
        with self.lock:
            if answer == "200":
                self.latencies.append(time.monotonic() - start)
            else:
                self.failures[answer] += 1


@dataclass(slots=True)
class Answers:
    """One category's answers, counted, and its slowest."""

    counts: Counter[str] = field(default_factory=Counter)
    slowest_s: float = 0.0


def fuzz(
    target: Target, threads: int, seconds: float, seed: int, only: list[str] | None = None
) -> dict[str, Answers]:
    """Hostile requests (of the categories `only`, if given) from `threads` threads until `seconds`
    have passed: each category's answers. (`main` runs it in a process of its own.)"""
    table = cases()
    names = sorted(only or table)
    answers: dict[str, Answers] = defaultdict(Answers)
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < deadline:
                name = rng.choice(names)
                start = time.monotonic()
                try:
                    answer = table[name](client, target)
                except (httpx.HTTPError, OSError) as err:
                    answer = type(err).__name__
                took = time.monotonic() - start
                with lock:
                    answers[name].counts[answer] += 1
                    answers[name].slowest_s = max(answers[name].slowest_s, took)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return dict(answers)


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` (0 if it is gone), MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def memory(pid: int) -> str:
    kids = children(pid)
    return f"serve {rss_mb(pid):.0f} MB, its {len(kids)} processes {sum(rss_mb(k) for k in kids):.0f} MB"


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Phase:
    """Where a phase began or ended: the instant, and the CPU seconds used by then."""

    at: float
    serve_cpu_s: float
    others_cpu_s: float  # the scheduler's and the workers'

    @staticmethod
    def now(pid: int) -> Phase:
        return Phase(time.monotonic(), cpu_s(pid), sum(cpu_s(k) for k in children(pid)))


def tracebacks(logs: Path) -> int:
    """Tracebacks written to the logs under `logs`."""
    found = (f.read_text(errors="replace") for f in logs.rglob("*.log"))
    return sum(text.count("Traceback (most recent call last)") for text in found)


def phase_line(name: str, load: GoodLoad, prober: Prober, start: Phase, end: Phase) -> str:
    lat = sorted(load.latencies)
    failed = sum(load.failures.values())
    cpu = (
        f"CPU s: serve {end.serve_cpu_s - start.serve_cpu_s:.1f}, scheduler and workers "
        f"{end.others_cpu_s - start.others_cpu_s:.1f}"
    )
    if not lat:
        return f"{name:<6} no good request completed; failures {dict(load.failures)}; {cpu}"
    p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))]
    return (
        f"{name:<6} good {len(lat):>4} done {failed:>3} failed {dict(load.failures) if failed else ''}  "
        f"latency median {statistics.median(lat) * 1e3:.1f} ms, p90 {p90 * 1e3:.1f} ms, "
        f"max {lat[-1] * 1e3:.1f} ms; /health worst {prober.worst(start.at, end.at) * 1e3:.1f} ms; {cpu}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=positive_float, default=30.0, help="each phase's length")
    parser.add_argument("--threads", type=positive_int, default=4, help="fuzzing threads")
    parser.add_argument("--rate", type=positive_float, default=2.0, help="good requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(cases()), help="these alone")
    parser.add_argument("extra", nargs="*", help="after --: arguments for sangam serve")
    args = parser.parse_args()
    target = Target("127.0.0.1", free_port())
    logs = Path(tempfile.mkdtemp(prefix="serve-fuzz-"))
    command = [sys.executable, "-m", "cli.main", "serve", "--port", str(target.port), "--workers", "1",
               "--mask-len", "128", "--log-dir", str(logs / "processes"), *args.extra]  # fmt: skip
    with (logs / "serve.log").open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    prober = Prober(target.url)
    try:
        wait_healthy(server, target.url, STARTUP_S, "serve_fuzz")
        prober.thread.start()
        calm = GoodLoad(target, args.rate)
        calm_start = Phase.now(server.pid)
        calm.run(args.seconds)
        calm_end = Phase.now(server.pid)
        before = memory(server.pid)
        load = GoodLoad(target, args.rate)
        good = threading.Thread(target=load.run, args=(args.seconds,))
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fuzzer:
            hostile = fuzzer.submit(fuzz, target, args.threads, args.seconds, args.seed, args.only)
            good.start()
            answers = hostile.result()
        good.join()
        fuzz_end = Phase.now(server.pid)
        after = memory(server.pid)
    finally:
        prober.stop.set()
        if prober.thread.is_alive():
            prober.thread.join(10)
        server.send_signal(signal.SIGTERM)
        server.wait(60)

    total = Counter[str]()
    print(f"{'category':<24} {'slowest s':>9}  answers")
    for name, got in sorted(answers.items()):
        total.update(got.counts)
        counts = "  ".join(f"{a} x{n}" for a, n in sorted(got.counts.items()))
        print(f"{name:<24} {got.slowest_s:>9.2f}  {counts}")
    fives = sum(n for a, n in total.items() if a.startswith("5"))
    print(f"hostile requests {sum(total.values())} from {args.threads} threads in {args.seconds:g} s: "
          + ", ".join(f"{a} x{n}" for a, n in sorted(total.items())))  # fmt: skip
    print(f"5xx answers {fives}; tracebacks in the server's logs {tracebacks(logs)} ({logs})")
    print(phase_line("calm", calm, prober, calm_start, calm_end))
    print(phase_line("fuzz", load, prober, calm_end, fuzz_end))
    print(f"memory before the fuzz: {before}; after: {after}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    if prober.failures:
        print(f"/health failed {prober.failures} times")


if __name__ == "__main__":
    main()
