"""The HTTP app on a real socket over a fake scheduler: shapes, every refusal, cancellation, metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import httpx
import openai
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import EOS, LIMITS, MASK, TOKENIZER, FakeBackend, app_server, letter

from executor.control.client import SangamError
from executor.control.messages import ClusterStatus, RequestState, Submission
from serve.backend import ServingState
from serve.output import CONTEXT_IDS, Output
from serve.server import listen
from serve.tokenizer import Message

M = "fake-model"  # the served model's name (serve_helpers.app_server's)


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeBackend]]:
    backend = FakeBackend()
    with app_server(backend) as (url, _):
        yield url, backend


def post(url: str, path: str, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=10, **kwargs)  # type: ignore[arg-type]


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == response.status_code
    assert {"message", "type", "param", "code"} <= set(body["error"])
    message: str = body["error"]["message"]
    assert "\n" not in message
    return message


def test_completion_text_is_cut_at_max_tokens_and_usage_counts(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    reply = client.completions.create(model=M, prompt="Hello", max_tokens=40, seed=7)
    sub = backend.submitted[-1]
    assert sub.gen_len == 64 and sub.sampling.seed == 7  # 40 tokens: two whole blocks
    assert sub.prompt == tuple(TOKENIZER.encode("Hello"))
    assert reply.choices[0].text == "A" * 32 + "B" * 8 and reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(sub.prompt), 40)
    assert reply.usage.total_tokens == len(sub.prompt) + 40


def test_eos_stops_the_text_with_finish_reason_stop() -> None:
    a, b, c = letter(0), letter(1), letter(2)
    backend = FakeBackend(tokens=lambda sub, block: [b] * 5 + [EOS] + [c] * 26 if block == 1 else [a] * 32)
    with app_server(backend) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "hi"}], max_tokens=128
        )
        through = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 64, "ignore_eos": True})
    assert through.json()["choices"][0] == {
        "index": 0,
        "text": "A" * 32 + "B" * 5 + "C" * 26,
        "logprobs": None,
        "finish_reason": "length",
    }  # the EOS itself decodes to nothing
    assert reply.choices[0].message.content == "A" * 32 + "B" * 5
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 38  # the EOS counts
    assert through.headers["x-sangam-request-id"] == str(len(backend.submitted) - 1)
    prompt = TOKENIZER.chat_prompt([Message("user", "hi")])
    assert backend.submitted[0].prompt == tuple(prompt) and prompt[-3:] != [EOS]


def test_stream_sends_one_chunk_per_block_then_usage_then_done(fake: tuple[str, FakeBackend]) -> None:
    url, _ = fake
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 70, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    blocks, usage = chunks[:-1], chunks[-1]
    assert len(blocks) == 3  # ceil(70 / 32)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert blocks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in blocks) == "A" * 32 + "B" * 32 + "C" * 6
    assert [c["choices"][0]["finish_reason"] for c in blocks] == [None, None, "length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 70


def test_bad_inputs_get_400_with_openai_error_json(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    too_long_for_context = LIMITS.context_len - LIMITS.mask_len + 1
    too_long_for_pages = LIMITS.pages * 16 - LIMITS.mask_len + 1
    assert too_long_for_pages < too_long_for_context
    cases = {
        "max_tokens: must lie in [1, 128]": ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
        "(the mask buffer), got 129": ("/v1/completions", {"prompt": "x", "max_tokens": 129}),
        "only n=1 is supported": (chat, {"messages": user, "n": 2}),
        "the prompt is empty": ("/v1/completions", {"prompt": ""}),
        "the prompt is empty ": ("/v1/completions", {"prompt": []}),
        "unknown role 'robot'": (chat, {"messages": [{"role": "robot", "content": "x"}]}),
        "at least one message": (chat, {"messages": []}),
        "outside the vocabulary [0, 300)": ("/v1/completions", {"prompt": [1, 2, 300]}),
        "token -1 at position 0": ("/v1/completions", {"prompt": [-1]}),
        "is the mask id": ("/v1/completions", {"prompt": [1, MASK]}),
        "the model's context window of 512": ("/v1/completions", {"prompt": [1] * too_long_for_context}),
        "for a worker's KV pool": ("/v1/completions", {"prompt": [1] * too_long_for_pages}),
        "one prompt per request, got 2": ("/v1/completions", {"prompt": ["a", "b"]}),
        # refused by length before the tokenizer, which would hold everyone else meanwhile
        "12000 characters cannot fit in the 384 tokens": ("/v1/completions", {"prompt": "ab " * 4000}),
        "12000 characters cannot fit ": (chat, {"messages": [{"role": "user", "content": "ab " * 2000}] * 2}),
        "temperature": (chat, {"messages": user, "temperature": -1}),
        "threshold": (chat, {"messages": user, "threshold": 1.5}),
        "forwards_per_block": (chat, {"messages": user, "forwards_per_block": 33}),
        "messages": (chat, {"prompt": "no messages"}),
    }
    before = len(backend.submitted)
    for needle, (path, body) in cases.items():
        response = post(url, path, body)
        assert response.status_code == 400, (needle, response.text)
        assert needle.strip() in error_of(response), needle
    assert len(backend.submitted) == before  # none reached the scheduler
    fits = post(url, "/v1/completions", {"prompt": [1] * (too_long_for_pages - 1), "max_tokens": 1})
    assert fits.status_code == 200, fits.text


def test_a_request_is_sized_by_its_max_tokens_and_without_one_by_the_whole_mask_buffer(
    fake: tuple[str, FakeBackend],
) -> None:
    url, backend = fake
    prompt = [1] * (LIMITS.pages * 16 - 64)  # fits beside 64 tokens, not beside 128 (window and pool)
    short = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 40})
    assert short.status_code == 200, short.text
    sub = backend.submitted[-1]
    assert (sub.gen_len, sub.response_len) == (64, 64)  # 40 tokens: two whole blocks
    whole = post(url, "/v1/completions", {"prompt": prompt})
    assert whole.status_code == 400 and "416 tokens plus the 128-token mask buffer exceed" in error_of(whole)
    assert post(url, "/v1/completions", {"prompt": "x"}).status_code == 200
    assert backend.submitted[-1].response_len == LIMITS.mask_len  # no max_tokens: the largest


def test_a_body_that_is_not_a_request_gets_400(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    cases = {
        b'{"prompt": "x", ': "Invalid JSON",
        b"[1, 2]": "Input should be an object",
        b"\xff\xfe": "Invalid JSON",
        b"": "Invalid JSON",
        b'{"prompt": "x", "max_tokens": "many"}': "max_tokens: Input should be a valid integer",
    }
    for body, needle in cases.items():
        response = httpx.post(url + "/v1/completions", content=body, timeout=10)
        assert response.status_code == 400, (body, response.text)
        assert needle in error_of(response), (body, error_of(response))
    body = b'{"prompt": "x", "max_tokens": 1}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        response = httpx.post(url + "/v1/completions", content=body, headers={"content-type": kind})
        assert response.status_code == 415 and "must be JSON" in error_of(response), kind
    assert len(backend.submitted) == before
    assert post(url, "/v1/completions", {"prompt": "x", "max_tokens": 1}).status_code == 200
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        response = httpx.post(url + "/v1/completions", content=body, headers={"content-type": kind})
        assert response.status_code == 200, kind


def test_the_openai_client_raises_bad_request(fake: tuple[str, FakeBackend]) -> None:
    url, _ = fake
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=M, prompt="x", max_tokens=10_000)


def test_api_key_guards_v1_but_not_health_or_metrics() -> None:
    with app_server(FakeBackend(), api_key="sekrit") as (url, _):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            response = httpx.get(url + "/v1/models", headers=headers)
            assert response.status_code == 401 and "API key" in error_of(response)
        bad_body = post(url, "/v1/completions", {"max_tokens": "nonsense"})
        assert bad_body.status_code == 401  # before the body is looked at
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekrit"}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200
        denied = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            denied.models.list()
        allowed = openai.OpenAI(base_url=url + "/v1", api_key="sekrit")
        assert [m.id for m in allowed.models.list()] == ["fake-model"]


def test_503_while_starting_failed_or_draining() -> None:
    state = ServingState()
    with app_server(FakeBackend(), state=state) as (url, _):
        for setup, needle in (
            (lambda: None, "starting"),
            (lambda: setattr(state, "limits", LIMITS) or setattr(state, "draining", True), "shutting down"),
            (lambda: setattr(state, "failure", "worker 0 exited"), "worker 0 exited"),
        ):
            setup()
            response = post(url, "/v1/completions", {"prompt": "x"})
            assert response.status_code == 503 and needle in error_of(response)
            assert response.headers["retry-after"] == "1"
            assert httpx.get(url + "/health").status_code == 503


def test_429_with_retry_after_once_max_waiting_requests_wait() -> None:
    backend = FakeBackend()
    with app_server(backend, max_waiting=2) as (url, state):

        async def main() -> list[int]:
            backend.hold = asyncio.Event()  # the app's loop runs in another thread: set only through it
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                waiting = [asyncio.create_task(client.post("/v1/completions", json={"prompt": "x"}))
                           for _ in range(2)]  # fmt: skip
                while state.waiting < 2:
                    await asyncio.sleep(0.01)
                refused = await client.post("/v1/completions", json={"prompt": "x"})
                for task in waiting:
                    task.cancel()
                return [refused.status_code, int(refused.headers["retry-after"]), len(backend.submitted)]

        status, retry_after, submitted = asyncio.run(main())
    assert (status, retry_after, submitted) == (429, 1, 2)


def test_a_client_that_disconnects_cancels_its_request() -> None:
    backend = FakeBackend()
    with app_server(backend) as (url, state):
        backend.hold = asyncio.Event()
        for stream in (False, True):
            host, port = url.removeprefix("http://").split(":")
            body = json.dumps({"prompt": "x", "max_tokens": 32, "stream": stream}).encode()
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                )  # fmt: skip
                deadline = time.monotonic() + 5
                while state.in_flight == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert state.in_flight == 1
            deadline = time.monotonic() + 5
            while len(backend.cancelled) < (2 if stream else 1) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert backend.cancelled[-1] == len(backend.submitted) - 1, stream
            assert state.in_flight == 0
        metrics = httpx.get(url + "/metrics").text
    samples = {
        (s.name, s.labels.get("finished_reason")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("sangam:request_success_total", "abort")] == 2


def test_metrics_parse_and_count_a_finished_request() -> None:
    with app_server(FakeBackend()) as (url, _):
        assert post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 64}).status_code == 200
        text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sangam:e2e_request_latency_seconds", "sangam:request_queue_time_seconds",
        "sangam:request_prefill_time_seconds", "sangam:request_decode_time_seconds",
        "sangam:num_requests_running", "sangam:num_requests_waiting", "sangam:kv_cache_usage_perc",
        "sangam:request_success", "sangam:prompt_tokens", "sangam:generation_tokens",
        "sangam:forwards_per_block", "sangam:blocks", "sangam:prefill_overflow", "sangam:kv_transfer_seconds",
        "sangam:worker_forwards_at_risk",
    ):  # fmt: skip
        assert name in families, name
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    model = (("model_name", "fake-model"),)
    assert value[("sangam:e2e_request_latency_seconds_count", model)] == 1
    assert value[("sangam:forwards_per_block_count", model)] == 2  # two blocks of 3 forwards each
    assert value[("sangam:forwards_per_block_sum", model)] == 6
    assert value[("sangam:blocks_total", model)] == 2
    assert value[("sangam:generation_tokens_total", model)] == 64
    assert value[("sangam:request_success_total", (("finished_reason", "length"), *model))] == 1
    assert value[("sangam:kv_cache_usage_perc", (*model, ("worker", "0")))] == 0.0
    assert value[("sangam:worker_forwards_at_risk", (*model, ("worker", "0")))] == 7  # as the status says


@given(st.lists(st.integers(0, 297), min_size=1, max_size=200), st.integers(1, 200))
@example(ids=[0] * 33, max_tokens=1)  # a block after the output ended at max_tokens adds nothing
def test_block_texts_join_to_the_whole_text(ids: list[int], max_tokens: int) -> None:
    """Whatever bytes the blocks split (an incomplete UTF-8 character at a block's end included)."""
    output = Output(TOKENIZER, (EOS,), max_tokens)
    blocks = [ids[i : i + 32] for i in range(0, len(ids), 32)]
    joined = "".join(output.add_block(block, i + 1 == len(blocks)) for i, block in enumerate(blocks))
    kept = ids[:max_tokens]
    assert joined == TOKENIZER.decode(kept) and output.completion_tokens == len(kept)


def test_each_block_decodes_its_own_ids_not_the_whole_output_again() -> None:
    decoded: list[int] = []

    class Counting:
        def decode(self, ids: Sequence[int]) -> str:
            decoded.append(len(ids))
            return TOKENIZER.decode(ids)

    output = Output(Counting(), (EOS,), 64 * 32)  # type: ignore[arg-type]  # decode is all it uses
    blocks = [[letter(i % 20)] * 32 for i in range(64)]
    joined = "".join(output.add_block(block, i == 63) for i, block in enumerate(blocks))
    assert joined == TOKENIZER.decode([t for block in blocks for t in block])
    assert sum(decoded) < 64 * 2 * (32 + 2 * CONTEXT_IDS)  # the whole output each block: 66,560 ids


def test_special_tokens_before_a_block_keep_the_space_a_sentencepiece_decoder_puts() -> None:
    """A Metaspace decoder drops the leading space of a text's first token: decoding a block after
    context ids that are all special (skipped) would glue it to the text before."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {"<s>": 0, "\u2581a": 1, "\u2581b": 2, "<unk>": 3}
    piece = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    piece.add_special_tokens([AddedToken("<s>", special=True)])
    piece.decoder = decoders.Metaspace()

    class Pieces:
        def decode(self, ids: Sequence[int]) -> str:
            text: str = piece.decode(list(ids), skip_special_tokens=True)
            return text

    output = Output(Pieces(), (), 100)  # type: ignore[arg-type]  # decode is all it uses
    blocks = [[1], [0, 0, 0, 0], [2]]
    joined = "".join(output.add_block(block, i == 2) for i, block in enumerate(blocks))
    assert joined == Pieces().decode([1, 0, 0, 0, 0, 2]) == "a b"


def test_split_character_waits_for_its_last_byte() -> None:
    euro = TOKENIZER.encode("€")  # three bytes, three ids (no merge learnt for it)
    assert len(euro) == 3
    output = Output(TOKENIZER, (EOS,), 100)
    assert output.add_block([letter(0), *euro[:2]], last=False) == "A"
    assert output.add_block(euro[2:], last=True) == "€"


def test_submission_carries_the_dllm_fields(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    body = {"prompt": "x", "max_tokens": 64, "threshold": 0.5, "forwards_per_block": 4, "temperature": 0.7}
    assert post(url, "/v1/completions", body).status_code == 200
    sub: Submission = backend.submitted[-1]
    assert sub.forwards == (4, 4) and sub.sampling.threshold == 0.5 and sub.sampling.temperature == 0.7


def test_accepted_connections_send_without_nagle_delay() -> None:
    """asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP; without it every response
    with a body waited ~40 ms for the client's delayed ACK (headers and body are two writes)."""

    async def main() -> int:
        sock = listen("127.0.0.1", 0)
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw = writer.get_extra_info("socket")
            accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        nodelay = await asyncio.wait_for(accepted, 5)
        writer.close()
        server.close()
        return nodelay

    assert asyncio.run(main()) != 0


def test_health_is_503_while_a_worker_is_lost_or_missing() -> None:
    backend = FakeBackend()
    with app_server(backend) as (url, _):
        assert httpx.get(url + "/health").status_code == 200
        healthy = backend.status

        async def lost() -> ClusterStatus:
            status = await healthy()
            return replace(status, workers=(replace(status.workers[0], lost=True),))

        async def missing() -> ClusterStatus:
            return replace(await healthy(), workers_registered=0, ready=False)

        for fake, needle in ((lost, "worker 0 lost"), (missing, "0 of 1 workers registered")):
            backend.status = fake  # type: ignore[method-assign]
            response = httpx.get(url + "/health")
            assert response.status_code == 503 and needle in response.json()["reason"]


def test_a_scheduler_that_cannot_take_the_request_is_503_and_one_at_its_call_limit_429() -> None:
    backend = FakeBackend()
    with app_server(backend) as (url, _):
        for code, status in (("UNAVAILABLE", 503), ("RESOURCE_EXHAUSTED", 429)):

            async def refuse(submission: Submission, code: str = code) -> RequestState:
                raise SangamError(f"scheduler: Submit: {code}: worker 0 lost and 1C has no worker left", code)

            backend.submit = refuse  # type: ignore[method-assign]
            response = post(url, "/v1/completions", {"prompt": "x"})
            assert response.status_code == status and code in error_of(response)
            assert response.headers["retry-after"] == "1"


def test_stop_string_across_blocks_cuts_the_text_and_cancels_the_rest() -> None:
    backend = FakeBackend()  # block b is 32 times letter b
    with app_server(backend) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        whole = client.completions.create(model=M, prompt="x", max_tokens=128, stop="AB")
        stream = client.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "hi"}], max_tokens=128, stop=["ZZ", "BBC"],
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    assert whole.choices[0].text == "A" * 31 and whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens == 33  # up to the B that completed it
    texts = [c.choices[0].delta.content for c in chunks[:-1]]
    assert texts == ["A" * 32, "B" * 30, ""]  # "BB" waited: it might have begun "BBC"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 65
    assert backend.cancelled == [0, 1]  # the scheduler was told to drop both requests' other blocks


@given(st.lists(st.integers(0, 297), min_size=1, max_size=150), st.data())
def test_texts_with_stop_strings_join_to_the_text_before_the_first(
    ids: list[int], data: st.DataObject
) -> None:
    whole = TOKENIZER.decode(ids)
    start = data.draw(st.integers(0, max(0, len(whole) - 1)))
    stop = whole[start : start + data.draw(st.integers(1, 4))] or "A"
    output = Output(TOKENIZER, (), len(ids), (stop, "\x00never"))
    blocks = [ids[i : i + 32] for i in range(0, len(ids), 32)]
    joined = ""
    for i, block in enumerate(blocks):
        joined += output.add_block(block, i + 1 == len(blocks))
        if output.finish is not None:
            break
    cut = whole.find(stop)
    assert joined == (whole if cut < 0 else whole[:cut])
    assert output.finish == ("length" if cut < 0 else "stop")


def test_echo_puts_the_prompt_before_the_completion(fake: tuple[str, FakeBackend]) -> None:
    url, _ = fake
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    reply = client.completions.create(model=M, prompt="Hello", max_tokens=4, echo=True)
    by_ids = client.completions.create(model=M, prompt=TOKENIZER.encode("Hi!"), max_tokens=4, echo=True)
    stream = client.completions.create(model=M, prompt="Hey", max_tokens=40, echo=True, stream=True)
    assert reply.choices[0].text == "Hello" + "A" * 4 and by_ids.choices[0].text == "Hi!AAAA"
    assert [c.choices[0].text for c in stream] == ["Hey" + "A" * 32, "B" * 8]
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_parameters_sangam_would_ignore_are_refused_naming_them(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    user = [{"role": "user", "content": "hi"}]
    before = len(backend.submitted)
    refused = {
        "logprobs": lambda: client.completions.create(model=M, prompt="x", logprobs=6),
        "best_of": lambda: client.completions.create(model=M, prompt="x", best_of=3),
        "suffix": lambda: client.completions.create(model=M, prompt="x", suffix="end"),
        "top_p": lambda: client.completions.create(model=M, prompt="x", top_p=0.5),
        "top_logprobs": lambda: client.chat.completions.create(model=M, messages=user, top_logprobs=3),
        "echo": lambda: client.chat.completions.create(model=M, messages=user, extra_body={"echo": True}),
        "n": lambda: client.chat.completions.create(model=M, messages=user, n=2),
        "stop": lambda: client.completions.create(model=M, prompt="x", stop=["ok", ""]),
        "top_k": lambda: client.completions.create(model=M, prompt="x", extra_body={"top_k": 5}),
    }
    for param, call in refused.items():
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert caught.value.status_code == 400
        assert caught.value.body["param"] == param and param in caught.value.body["message"], param
    assert len(backend.submitted) == before  # none reached the scheduler
    neutral = client.completions.create(
        model=M, prompt="x", max_tokens=1, top_p=1, logprobs=None, best_of=1, presence_penalty=0, user="u"
    )  # what some clients send always: changes nothing, accepted
    assert neutral.choices[0].text == "A"


def test_the_last_chunk_usage_and_done_go_out_in_one_write(fake: tuple[str, FakeBackend]) -> None:
    """One write (one HTTP chunk) fewer at the end of every stream: the client sees its end sooner."""
    url, _ = fake
    body = json.dumps(
        {"prompt": "x", "max_tokens": 70, "stream": True, "stream_options": {"include_usage": True}}
    )
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}".encode()
        )
        raw = b""
        while piece := sock.recv(65536):
            raw += piece
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    writes = []
    while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
        start = rest.index(b"\r\n") + 2
        writes.append(rest[start : start + size].decode())
        rest = rest[start + size + 2 :]
    assert len(writes) == 3  # blocks 1 and 2, then block 3 with the usage chunk and [DONE]
    last = writes[-1].split("\n\n")
    assert '"finish_reason":"length"' in last[0] and '"usage":{' in last[1] and last[2] == "data: [DONE]"
