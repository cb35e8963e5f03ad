"""Log-probs through the HTTP app over a fake scheduler (whose log-probs `serve_helpers.fake_logprobs`
makes): OpenAI's shapes for chat and completions, streamed per block and not, which tokens get an entry,
the bounds, and usage unchanged. The worker's own numbers are tests/executor/test_logprobs.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import EOS, TOKENIZER, FakeBackend, app_server, fake_logprobs, letter

from serve.tokenizer import BuiltinTokenizer

M = "fake-model"
USER: Any = [{"role": "user", "content": "hi"}]


def tokens(block: int) -> list[int]:
    """Block 0: 32 As; block 1: ten Bs, an EOS (which a request's text passes only with ignore_eos; the
    scheduler ends the request after its block), then Cs."""
    return [letter(0)] * 32 if block == 0 else [letter(1)] * 10 + [EOS] + [letter(2)] * 21


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, FakeBackend]]:
    backend = FakeBackend(tokens=lambda sub, block: tokens(block))
    with app_server(backend) as (url, _):
        yield url, backend


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def expected(n: int, top: int) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """The entries of the first `n` output tokens: (text, log-prob, alternatives), the EOS left out."""
    ids = [*tokens(0), *tokens(1)][:n]
    scores = fake_logprobs(ids, top)
    return [
        (TOKENIZER.token_text(t), scores.token[i],
         [(TOKENIZER.token_text(a), lp) for a, lp in scores.alternatives(i)])
        for i, t in enumerate(ids)
        if t != EOS
    ]  # fmt: skip


def chat_entries(content: Any) -> list[tuple[str, float, list[tuple[str, float]]]]:
    for entry in content:
        assert entry.bytes == list(entry.token.encode()), entry
        assert all(alt.bytes == list(alt.token.encode()) for alt in entry.top_logprobs)
    return [(e.token, e.logprob, [(a.token, a.logprob) for a in e.top_logprobs]) for e in content]


def test_chat_gives_each_text_tokens_logprob_and_alternatives_streamed_per_block_and_not(
    served: tuple[str, FakeBackend],
) -> None:
    url, backend = served
    ask = dict(model=M, messages=USER, max_tokens=64, extra_body={"ignore_eos": True})
    plain = client(url).chat.completions.create(**ask)
    whole = client(url).chat.completions.create(**ask, logprobs=True, top_logprobs=3)
    assert backend.submitted[-1].sampling.logprobs == 3
    assert plain.choices[0].logprobs is None
    assert whole.choices[0].logprobs is not None and whole.choices[0].logprobs.content is not None
    assert chat_entries(whole.choices[0].logprobs.content) == expected(64, 3)  # the EOS: no entry
    assert whole.usage == plain.usage and whole.choices[0].message.content == plain.choices[0].message.content

    stream = client(url).chat.completions.create(**ask, logprobs=True, top_logprobs=3, stream=True)
    chunks = list(stream)
    assert len(chunks) == 2  # one per block, each with its block's tokens
    per_chunk = [chat_entries(c.choices[0].logprobs.content) for c in chunks]
    assert [len(entries) for entries in per_chunk] == [32, 31]
    assert per_chunk[0] + per_chunk[1] == expected(64, 3)


def test_a_completion_gives_tokens_logprobs_likeliest_and_offsets(served: tuple[str, FakeBackend]) -> None:
    url, backend = served
    reply = client(url).completions.create(model=M, prompt="x", max_tokens=40, logprobs=2)
    assert backend.submitted[-1].sampling.logprobs == 2
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.top_logprobs is not None
    want = expected(40, 2)  # cut at max_tokens
    assert len(want) == 40 and logprobs.tokens == [text for text, _, _ in want]
    assert logprobs.token_logprobs == [lp for _, lp, _ in want]
    assert logprobs.top_logprobs == [dict(alts) | {text: lp} for text, lp, alts in want]
    assert logprobs.text_offset == list(range(40))  # one character a token here
    assert "".join(logprobs.tokens) == reply.choices[0].text

    through: Any = dict(model=M, prompt="x", max_tokens=64, logprobs=0, extra_body={"ignore_eos": True})
    whole = client(url).completions.create(**through)
    chunks = list(client(url).completions.create(**through, stream=True))
    assert len(chunks) == 2
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for key, values in joined.items():
            values += getattr(c.choices[0].logprobs, key)
    assert joined == {key: getattr(whole.choices[0].logprobs, key) for key in joined}
    assert joined["text_offset"] == list(range(63))  # continued across the chunks: 64 tokens, one EOS
    assert joined["top_logprobs"][0] == {"A": 0.0}  # logprobs 0: the chosen token alone


def test_a_stop_string_ends_the_entries_at_the_token_that_completed_it(
    served: tuple[str, FakeBackend],
) -> None:
    url, _ = served
    reply = client(url).chat.completions.create(
        model=M, messages=USER, max_tokens=64, stop=["AAB"], logprobs=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].message.content == "A" * 30 and reply.choices[0].finish_reason == "stop"
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [e.token for e in logprobs.content] == ["A"] * 32 + ["B"]  # the ids the usage counts
    assert reply.usage is not None and reply.usage.completion_tokens == 33


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json={"max_tokens": 1, **body}, timeout=10)


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        ("/chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20], got 21"),
        ("/chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "[0, 20], got -1"),
        ("/chat", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        ("/chat", {"logprobs": 1}, "logprobs", "valid boolean"),
        ("/chat", {"logprobs": True, "top_logprobs": 2.0}, "top_logprobs", "valid integer"),
        ("", {"logprobs": 6}, "logprobs", "[0, 5], got 6"),
        ("", {"logprobs": -1}, "logprobs", "[0, 5], got -1"),
        ("", {"logprobs": True}, "logprobs", "valid integer"),
        ("", {"logprobs": 1, "echo": True}, "echo", "with logprobs"),
    ],
)
def test_out_of_bounds_logprobs_are_refused_with_openais_error(
    served: tuple[str, FakeBackend], path: str, body: dict[str, Any], param: str, says: str
) -> None:
    url, backend = served
    before = len(backend.submitted)
    prompt = {"messages": USER} if path else {"prompt": "x"}
    answer = post(url, f"/v1{path}/completions", {**prompt, **body})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == param
    assert says in error["message"]
    assert len(backend.submitted) == before


def test_neutral_values_ask_for_nothing(served: tuple[str, FakeBackend]) -> None:
    url, backend = served
    asks: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": USER, "logprobs": False, "top_logprobs": 0}),
        ("/v1/completions", {"prompt": "x", "logprobs": None}),
    ]
    for path, body in asks:
        answer = post(url, path, body)
        assert answer.status_code == 200 and answer.json()["choices"][0]["logprobs"] is None
        assert backend.submitted[-1].sampling.logprobs is None


def test_the_builtin_tokenizer_names_each_token_and_knows_its_special_ones() -> None:
    tokenizer = BuiltinTokenizer()
    euro = tokenizer.encode("€")  # three ids, one byte each: none is a character on its own
    assert [tokenizer.token_text(t) for t in euro] == ["\ufffd"] * 3
    assert tokenizer.token_text(letter(0)) == "A" and not tokenizer.is_special(letter(0))
    assert tokenizer.token_text(EOS) == "<|endoftext|>" and tokenizer.is_special(EOS)
    assert tokenizer.is_special(10_000) and tokenizer.token_text(10_000) == ""


def test_a_whole_responses_logprobs_are_built_off_the_event_loop(
    served: tuple[str, FakeBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring and serializing up to 1,024 tokens x 20 candidates held every other client for 0.1-0.4 s on
    the event loop: a non-streamed response with log-probs is built on the tokenizing thread (one without
    stays on the loop: a thread hop costs more than it saves)."""
    import threading

    from serve import app as serve_app

    built = []
    original = serve_app.json_response

    def recording(body: Any, headers: dict[str, str]) -> Any:
        built.append(threading.current_thread().name)
        return original(body, headers)

    monkeypatch.setattr(serve_app, "json_response", recording)
    url, _ = served
    ask = dict(model=M, messages=USER, max_tokens=64)
    client(url).chat.completions.create(**ask, logprobs=True, top_logprobs=3)
    client(url).completions.create(model=M, prompt="x", max_tokens=40, logprobs=2)
    client(url).chat.completions.create(**ask)
    assert [name.startswith("tokenize") for name in built] == [True, True, False], built
