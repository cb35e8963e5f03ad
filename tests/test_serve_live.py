"""`sangam serve` as a user runs it: a subprocess with the scheduler and a tiny CPU worker behind it, the
official `openai` client on a real socket."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_helpers import descendants, wait_gone
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import TOKENIZER, start_serve, wait_http

from executor.control.client import SangamClient
from executor.run.ports import free_port

pytestmark = pytest.mark.timeout(180)

MASK_LEN = 128  # four blocks at most
KEY = "test-key"  # the module's server runs with --api-key
AUTH = {"Authorization": f"Bearer {KEY}"}
FAST = {"forwards_per_block": 2}  # forced forwards: a block takes two forwards on the tiny model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One `sangam serve` (one CPU worker) for the module; its base URL and log directory."""
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    logs = tmp / "logs"
    args = ["--workers", "1", "--port", str(port), "--mask-len", str(MASK_LEN), "--log-dir", str(logs)]
    args += ["--api-key", KEY]
    process = start_serve(args, tmp / "out.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", process, timeout=120)
        yield url, logs
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def scheduler(logs: Path) -> SangamClient:
    """A gRPC client of the server's scheduler (its address is in the log directory)."""
    return SangamClient(json.loads((logs / "scheduler.json").read_text())["address"], api_key=KEY)


def metric_values(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text  # open: no key needed
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_streamed_chunks_join_to_the_non_streamed_text_one_per_block(server: tuple[str, Path]) -> None:
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    messages = [{"role": "user", "content": "Tell me about diffusion language models."}]
    whole = client.chat.completions.create(model="tiny-llada", messages=messages, max_tokens=70, seed=3)
    stream = client.chat.completions.create(
        model="tiny-llada", messages=messages, max_tokens=70, seed=3, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    usage = chunks[-1].usage
    blocks = chunks[:-1]
    assert whole.usage is not None and usage is not None and usage == whole.usage
    text = whole.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in blocks) == text
    assert len(blocks) == math.ceil(whole.usage.completion_tokens / 32)  # one chunk per committed block
    assert blocks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.choices[0].finish_reason in ("stop", "length")
    if whole.choices[0].finish_reason == "length":
        assert whole.usage.completion_tokens == 70
    prompt = TOKENIZER.chat_prompt([])  # the template alone: the messages' tokens come on top
    assert whole.usage.prompt_tokens > len(prompt)


def test_completions_from_text_and_from_token_ids(server: tuple[str, Path]) -> None:
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    assert [m.id for m in client.models.list()] == ["tiny-llada"]
    text = "Hello, world!"
    by_text = client.completions.create(model="tiny-llada", prompt=text, max_tokens=40, extra_body=FAST)
    ids = TOKENIZER.encode(text)
    by_ids = client.completions.create(model="tiny-llada", prompt=ids, max_tokens=40, extra_body=FAST)
    assert by_text.usage is not None and by_text.usage.prompt_tokens == len(ids)
    assert by_text.choices[0].text == by_ids.choices[0].text
    streamed = client.completions.create(
        model="tiny-llada", prompt=ids, max_tokens=40, extra_body=FAST, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == by_ids.choices[0].text


def test_logprobs_reach_the_openai_client_streamed_and_not_and_change_no_usage(
    server: tuple[str, Path],
) -> None:
    """Argmax unmasking (the default) commits each position's likeliest token: its log-prob is the first
    alternative's. The model's numbers themselves are tests/executor/test_logprobs.py's."""
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    chat: Any = dict(model="tiny-llada", messages=[{"role": "user", "content": "Hi"}], max_tokens=40, seed=2,
                     extra_body=FAST)  # fmt: skip
    plain = client.chat.completions.create(**chat)
    whole = client.chat.completions.create(**chat, logprobs=True, top_logprobs=2)
    assert whole.usage == plain.usage and whole.choices[0].message.content == plain.choices[0].message.content
    assert whole.usage is not None and whole.choices[0].logprobs is not None
    content = whole.choices[0].logprobs.content
    assert content is not None  # an entry per token of the text (the EOS, which ends it, has none)
    assert len(content) == whole.usage.completion_tokens - (whole.choices[0].finish_reason == "stop")
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == entry.top_logprobs[0].logprob < 0 and entry.bytes == list(
            entry.token.encode()
        )
    chunks = list(client.chat.completions.create(**chat, logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for c in chunks if c.choices for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]

    ids = TOKENIZER.encode("Hello")
    completion: Any = dict(model="tiny-llada", prompt=ids, max_tokens=40, extra_body=FAST, logprobs=3)
    reply = client.completions.create(**completion)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert reply.usage is not None
    assert len(logprobs.tokens) == reply.usage.completion_tokens - (reply.choices[0].finish_reason == "stop")
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert top is not None and top[token] == logprob == max(top.values())
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    pieces = list(client.completions.create(**completion, stream=True))
    assert [t for p in pieces for t in p.choices[0].logprobs.tokens] == logprobs.tokens
    assert [o for p in pieces for o in p.choices[0].logprobs.text_offset] == logprobs.text_offset

    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(**chat, logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(**{**completion, "logprobs": 6})


def test_bad_inputs_are_refused_and_nobody_else_notices(server: tuple[str, Path]) -> None:
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="context window"):
        client.completions.create(model="tiny-llada", prompt=[1] * 5000, max_tokens=32)
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model="tiny-llada", prompt=[1, 300], max_tokens=32)
    with pytest.raises(openai.BadRequestError, match="mask buffer"):
        client.completions.create(model="tiny-llada", prompt="x", max_tokens=MASK_LEN + 1)
    ok = client.completions.create(model="tiny-llada", prompt="x", max_tokens=32, extra_body=FAST)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_a_short_max_tokens_is_a_short_mask_buffer_at_the_scheduler(server: tuple[str, Path]) -> None:
    url, logs = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    short = client.completions.with_raw_response.create(
        model="tiny-llada", prompt="a short answer", max_tokens=40, extra_body=FAST
    )
    whole = client.completions.with_raw_response.create(
        model="tiny-llada", prompt="all of it", extra_body=FAST
    )
    with scheduler(logs) as grpc_client:
        records = {r.id: r for r in grpc_client.results()}
    sized = records[int(short.headers["x-sangam-request-id"])]
    usage = short.parse().usage
    assert usage is not None and sized.prompt_len == usage.prompt_tokens
    assert (sized.mask_len, sized.seq_len) == (64, usage.prompt_tokens + 64)  # 40 tokens: two blocks
    assert records[int(whole.headers["x-sangam-request-id"])].mask_len == MASK_LEN  # no max_tokens


def test_200_concurrent_streaming_chats_lose_nothing(server: tuple[str, Path]) -> None:
    url, _ = server

    async def task(index: int, count: int) -> list[str | None]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)

        async def chat(n: int) -> str | None:
            stream = await client.chat.completions.create(
                model="tiny-llada", messages=[{"role": "user", "content": f"request {index}.{n}"}],
                max_tokens=32, stream=True, extra_body=FAST,
            )  # fmt: skip
            finish = None
            async for chunk in stream:
                finish = chunk.choices[0].finish_reason or finish
            return finish

        try:
            return list(await asyncio.gather(*(chat(n) for n in range(count))))
        finally:
            await client.close()

    async def main() -> list[str | None]:
        counts = [200 // 16 + (i < 200 % 16) for i in range(16)]
        results = await asyncio.gather(*(task(i, c) for i, c in enumerate(counts)))
        return [finish for per_task in results for finish in per_task]

    started = time.monotonic()
    finishes = asyncio.run(main())
    assert len(finishes) == 200 and all(f in ("stop", "length") for f in finishes), finishes
    assert httpx.get(url + "/health").status_code == 200
    values = metric_values(url)
    assert values[("sangam:num_requests_running", ())] == 0
    assert values[("sangam:num_requests_waiting", ())] == 0
    print(f"200 streaming chats: {time.monotonic() - started:.1f} s")


def test_a_client_that_disconnects_frees_its_pages(server: tuple[str, Path]) -> None:
    url, logs = server
    with scheduler(logs) as grpc_client:
        before = grpc_client.status()
        body = {"prompt": "a long one", "max_tokens": MASK_LEN, "stream": True, "forwards_per_block": 32}
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line).startswith("data: ")  # the first block is in
            deadline = time.monotonic() + 10
            while metric_values(url)[("sangam:kv_cache_usage_perc", (("worker", "0"),))] == 0:
                assert time.monotonic() < deadline, "the request's next block never held pages"
        deadline = time.monotonic() + 10
        while (status := grpc_client.status()).errors == before.errors:
            assert time.monotonic() < deadline, "the request was not cancelled"
            time.sleep(0.05)
        assert status.done == before.done  # cancelled, not finished
        deadline = time.monotonic() + 10
        while metric_values(url)[("sangam:kv_cache_usage_perc", (("worker", "0"),))] != 0:
            assert time.monotonic() < deadline, "the worker kept the cancelled request's pages"
            time.sleep(0.05)
    values = metric_values(url)
    assert values[("sangam:request_success_total", (("finished_reason", "abort"),))] >= 1
    assert values[("sangam:num_requests_running", ())] == 0


def test_sigterm_drains_running_requests_writes_results_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "results"
    args = ["--workers", "1", "--port", str(port), "--mask-len", "256", "--out", str(out)]
    args += ["--drain-timeout", "60"]
    process = start_serve(args, tmp_path / "out.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process, timeout=120)
    children = descendants(process.pid)
    assert children  # the scheduler and the worker
    body = {"prompt": "drain me", "max_tokens": 256, "stream": True, "forwards_per_block": 32}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        lines = (line for line in response.iter_lines() if line)
        first = next(lines)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (refused := httpx.post(url + "/v1/completions", json={"prompt": "late"})).status_code != 503:
            assert time.monotonic() < deadline
        assert "shutting down" in refused.json()["error"]["message"]
        rest = list(lines)
    chunks = [json.loads(line.removeprefix("data: ")) for line in [first, *rest[:-1]]]
    assert rest[-1] == "data: [DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert process.wait(60) == 0
    assert not wait_gone(children, 10), "a scheduler or worker outlived sangam serve"
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == 2  # header and the drained request
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is False
    assert (summary["workers_lost"], summary["failed"]) == (0, 0)  # the run's recovery counts
    config = summary["config"]  # what served, and none of the simulator's workload defaults
    assert (config["model"], config["model_spec"], config["weights"]) == ("tiny-llada", "llada-8b", "random")
    assert (config["quantization"], config["kv_cache_dtype"]) == (None, "auto")
    assert (config["devices"], config["layout"], config["mask_len"]) == (["cpu"], "1C", 256)
    assert config["server"] == "sangam serve" and config["served_model_name"] == ["tiny-llada"]
    assert not {"gpu", "gpus", "qps", "num_requests", "trace", "arrival_cv"} & set(config)


def test_a_drain_ends_within_its_timeout_and_cuts_what_still_runs(tmp_path: Path) -> None:
    """Requests far longer than --drain-timeout: at its end each gets its answer (a stream its error event
    and [DONE], a plain request a 503), and the server, its processes stopped, exits within the timeout
    (plus a margin for the interpreter's start of the stop and its exit)."""
    port = free_port()
    drain = 3.0
    args = ["--workers", "1", "--port", str(port), "--mask-len", "4032", "--drain-timeout", str(drain)]
    log = tmp_path / "out.log"
    process = start_serve(args, log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process, timeout=120)
    children = descendants(process.pid)
    body = {"prompt": "drain me", "max_tokens": 4032, "forwards_per_block": 32}  # 126 blocks: many seconds
    plain: dict[str, httpx.Response] = {}
    waiter = threading.Thread(
        target=lambda: plain.update(r=httpx.post(url + "/v1/completions", json=body, timeout=120))
    )
    streamed = {**body, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=streamed, timeout=120) as response:
        lines = (line for line in response.iter_lines() if line)
        next(lines)  # the first block: the request runs
        waiter.start()
        deadline = time.monotonic() + 30
        while metric_values(url)[("sangam:num_requests_running", ())] < 2:
            assert time.monotonic() < deadline, "the plain request did not start"
            time.sleep(0.05)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert process.wait(60) == 0
    took = time.monotonic() - signalled
    waiter.join(10)
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert "shut down before the request finished" in error["message"]
    assert plain["r"].status_code == 503 and "shut down" in plain["r"].json()["error"]["message"]
    assert took < drain + 1.5, f"the drain took {took:.2f} s with --drain-timeout {drain:g}"
    assert not wait_gone(children, 10), "a scheduler or worker outlived sangam serve"
    text = log.read_text()
    assert "Traceback" not in text and "never awaited" not in text, text


def test_a_stop_string_ends_the_text_and_frees_the_worker(server: tuple[str, Path]) -> None:
    url, logs = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    slow = {"forwards_per_block": 32}  # four blocks of 32 forwards: the cancel comes long before the end
    first = client.completions.create(
        model="tiny-llada", prompt="Once", max_tokens=32, seed=5, extra_body=slow
    )
    text = first.choices[0].text
    stop = text[len(text) // 2 :][:3]
    assert stop
    raw = client.completions.with_raw_response.create(
        model="tiny-llada", prompt="Once", max_tokens=MASK_LEN, seed=5, stop=[stop], extra_body=slow
    )
    reply = raw.parse()
    assert reply.choices[0].text == text[: text.find(stop)] and reply.choices[0].finish_reason == "stop"
    rid = int(raw.headers["x-sangam-request-id"])
    with scheduler(logs) as grpc_client:
        deadline = time.monotonic() + 10
        while (state := grpc_client.poll(rid)).status == "RUNNING":
            assert time.monotonic() < deadline, "the stopped request kept its worker"
            time.sleep(0.05)
    assert state.status == "ERROR" and "cancelled" in state.error and state.blocks_done < 4
    echoed = client.completions.create(model="tiny-llada", prompt="Once", max_tokens=32, seed=5, echo=True,
                                       extra_body=slow)  # fmt: skip
    assert echoed.choices[0].text == "Once" + text


def test_a_worker_that_dies_at_every_start_is_given_up_with_the_reason_in_the_log_and_health(
    tmp_path: Path,
) -> None:
    """--restart-workers --restart-limit 2: every process of the only worker is killed as soon as it
    appears; after two restarts (1 s, then 2 s later) the launcher gives the worker up instead of looping,
    says so in its log, and /health names the reason."""
    port, logs = free_port(), tmp_path / "logs"
    args = ["--workers", "1", "--port", str(port), "--log-dir", str(logs), "--mask-len", "64"]
    args += ["--restart-workers", "--restart-limit", "2"]
    log = tmp_path / "out.log"
    process = start_serve(args, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", process, timeout=120)
        scheduler_pid = json.loads((logs / "scheduler.json").read_text())["pid"]
        killed: set[int] = set()
        deadline = time.monotonic() + 90
        while (
            health := httpx.get(url + "/health", timeout=10)
        ).status_code != 503 or "gave up" not in health.text:
            assert time.monotonic() < deadline, f"not given up: {health.text}; killed {len(killed)}"
            for pid in descendants(process.pid) - {scheduler_pid} - killed:
                os.kill(pid, signal.SIGKILL)  # the worker's process, at whatever point of its start
                killed.add(pid)
            time.sleep(0.05)
        reason = health.json()["reason"]
        assert "gave up restarting it after 2 restarts in a row" in reason and "SIGKILL" in reason, reason
        assert len(killed) == 3  # the first process and its two restarts, and no third
        assert descendants(process.pid) == {scheduler_pid}
        text = log.read_text()
        assert text.count("restarting it in") == 2 and "restarting it in 2 s" in text, text
        assert "gave up restarting it" in text
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 1  # the cluster failed: no worker left to serve
