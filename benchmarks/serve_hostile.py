"""Hostile requests against `sangam serve`: how long `/health` waits while each is handled.

Run: python -m benchmarks.serve_hostile [--url URL] [--api-key KEY] [--slow] [-- SERVE ARGS]

Without `--url` it starts `sangam serve --workers 1 --mask-len 128` (the tiny CPU model) on a free port,
with SERVE ARGS added, and stops it at the end. Each request below is sent alone while a thread asks
`/health` back to back on its own connection; per request it prints the status, how long the request
took, and `/health`'s worst answer time from the request's send to its answer (plus 0.2 s after). A
first row, `idle`, is `/health` with nothing else running.

- `stop_1mb`, `stop_300k`: one stop string of 1,000,000 (300,000) characters, for a text of two blocks;
- `stops_many`: 100,000 one-character stop strings;
- `messages_170k`: 170,000 empty chat messages (5.6 MB);
- `parts_300k`: one chat message of 300,000 empty content parts;
- `prompt_100k`: a completion prompt of 98,000 characters (under the tiny model's bound of characters,
  so it is tokenized, then refused as too many tokens);
- `prompt_4mb`: a completion prompt of 4 MB of text;
- `prompt_ids_1m`: a completion prompt of 1,000,000 token ids;
- `label_8mb`: an 8 MB string in a field that only labels the request (`user`);
- `nested`: a prompt of 100,000 nested lists;
- the largest requests the bounds let through to the parse and beyond: `stops_4x1024` (four stop strings
  of 1,024 characters, over four blocks), `messages_2048`, `parts_2048`, `ids_4000` (a prompt of 4,000
  token ids), `escaped_100k` (100,000 non-ASCII characters, escaped in the JSON), `label_1_6mb` (a body
  of 1.6 MB, under the tiny model's bound of 1,667,584 bytes).

`--slow` adds the slow connections: one that sends half its headers, one that sends its headers and
half its body, one idle after a response (keep-alive); each is watched for up to 60 s and the row says
after how long the server closed it (or that it was still open).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.serve_bench import wait_healthy
from executor.run.ports import free_port

STARTUP_S = 300.0
AFTER_S = 0.2  # /health is watched this long after each request's answer too
SLOW_WATCH_S = 60.0


def bodies() -> dict[str, tuple[str, bytes]]:
    """Each hostile request: its path and its JSON body."""
    chat, completions = "/v1/chat/completions", "/v1/completions"

    def of(body: object) -> bytes:
        return json.dumps(body).encode()

    # two blocks of one forward each, whatever the model generates: the text is checked against the stop
    # strings after each block
    two_blocks = {"prompt": "hi", "max_tokens": 64, "ignore_eos": True, "forwards_per_block": 1}
    four_blocks = {**two_blocks, "max_tokens": 128}

    return {
        "stop_1mb": (completions, of({**two_blocks, "stop": ["x" * 1_000_000]})),
        "stop_300k": (completions, of({**two_blocks, "stop": ["x" * 300_000]})),
        "stops_many": (completions, of({**two_blocks, "stop": ["\x00"] * 100_000})),
        "messages_170k": (chat, of({"messages": [{"role": "user", "content": ""}] * 170_000})),
        "parts_300k": (
            chat,
            of({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 300_000}]}),
        ),
        "prompt_100k": (completions, of({"prompt": "Hello, wörld! " * 7_000, "max_tokens": 32})),
        "prompt_4mb": (completions, of({"prompt": "ab " * 1_400_000, "max_tokens": 32})),
        "prompt_ids_1m": (completions, of({"prompt": [1] * 1_000_000, "max_tokens": 32})),
        "label_8mb": (completions, of({"prompt": "hi", "max_tokens": 32, "user": "u" * 8_000_000})),
        # the largest that the bounds let through to the parse and beyond
        "stops_4x1024": (completions, of({**four_blocks, "stop": ["x" * 1023 + str(i) for i in range(4)]})),
        "messages_2048": (chat, of({"messages": [{"role": "user", "content": "Hi there. " * 4}] * 2048})),
        "parts_2048": (
            chat,
            of({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi. "}] * 2048}]}),
        ),
        "ids_4000": (completions, of({"prompt": [1] * 4000, "max_tokens": 32})),
        "escaped_100k": (completions, of({"prompt": "é" * 100_000, "max_tokens": 32})),
        "label_1_6mb": (completions, of({"prompt": "hi", "max_tokens": 32, "user": "u" * 1_600_000})),
        "nested": (completions, ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()),
    }


class Prober:
    """`/health` asked back to back from a thread; each answer's send and receive instants."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[tuple[float, float]] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                start = time.monotonic()
                try:
                    client.get(self.url + "/health")
                except httpx.HTTPError:
                    self.failures += 1
                self.times.append((start, time.monotonic()))
                time.sleep(0.002)

    def worst(self, start: float, end: float) -> float:
        """The longest answer that overlapped [start, end], in seconds."""
        return max((b - a for a, b in self.times if b >= start and a <= end), default=float("nan"))


def hostile(url: str, headers: dict[str, str], prober: Prober, only: list[str] | None) -> None:
    print(f"{'request':<16}{'body MB':>9}{'status':>8}{'request s':>11}{'/health worst ms':>18}  answer")
    time.sleep(1.0)
    now = time.monotonic()
    print(f"{'idle':<16}{'':>9}{'':>8}{'':>11}{prober.worst(now - 1.0, now) * 1e3:>18.1f}")
    with httpx.Client(timeout=300) as client:
        for name, (path, body) in bodies().items():
            if only is not None and name not in only:
                continue
            start = time.monotonic()
            try:
                response = client.post(url + path, content=body, headers=headers)
                status, text = str(response.status_code), response.text
            except httpx.HTTPError as err:
                status, text = "-", f"{type(err).__name__}: {err}"
            end = time.monotonic()
            time.sleep(AFTER_S)
            worst = prober.worst(start, end + AFTER_S) * 1e3
            print(f"{name:<16}{len(body) / 1e6:>9.1f}{status:>8}{end - start:>11.2f}{worst:>18.1f}  "
                  f"{text[:90]!r}", flush=True)  # fmt: skip


def open_for(host: str, port: int, send: bytes) -> str:
    """Send `send`, then wait for the server to close the connection: after how long it did."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(send)
        start = time.monotonic()
        sock.settimeout(SLOW_WATCH_S)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return f"still open after {SLOW_WATCH_S:g} s"
        except ConnectionError as err:
            return f"reset after {time.monotonic() - start:.1f} s ({err})"
        return f"closed after {time.monotonic() - start:.1f} s"


def slow(url: str, headers: dict[str, str]) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    auth = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}"
    cases = {
        "partial headers": head.encode(),
        "partial body": (head + 'content-length: 100\r\n\r\n{"prompt": ').encode(),
        "keep-alive idle": b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
    }
    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, open_for(host, int(port), s)))
        for n, s in cases.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in cases:
        print(f"{name:<18}{results[name]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server's base URL (default: start one)")
    parser.add_argument("--api-key", help="the server's API key")
    parser.add_argument("--slow", action="store_true", help="also the slow connections (a minute)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these requests alone")
    parser.add_argument("extra", nargs="*", help="after --: arguments for sangam serve")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    server = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        logs = Path(tempfile.mkdtemp(prefix="serve-hostile-"))
        command = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--workers", "1",
                   "--mask-len", "128", "--log-dir", str(logs), *args.extra]  # fmt: skip
        server = subprocess.Popen(command)
        wait_healthy(server, url, STARTUP_S, "serve_hostile")
    prober = Prober(url.rstrip("/"))
    prober.thread.start()
    try:
        hostile(url.rstrip("/"), headers, prober, args.only)
        if args.slow:
            slow(url.rstrip("/"), headers)
    finally:
        prober.stop.set()
        prober.thread.join(10)
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    if prober.failures:
        print(f"/health failed {prober.failures} times")


if __name__ == "__main__":
    main()
