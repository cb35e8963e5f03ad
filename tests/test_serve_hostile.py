"""The HTTP app against hostile and careless clients, on real sockets over a fake scheduler (issue 29):
bounded work per request, timeouts of slow connections, strict types and OpenAI's shapes, a client that
leaves mid-body. Nothing here measures time: a server that holds its event loop is caught by a request
that cannot be answered meanwhile (`/health` while the tokenizer is held), and the timeouts are short
enough that a connection cut by them is told apart from one left open by a wait ten times longer.
(`benchmarks/serve_hostile.py` measures how long `/health` waits.)"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from serve_helpers import LIMITS, TOKENIZER, FakeBackend, app_server

from sangam.hardware import BLOCK
from serve import app as serve_app
from serve.checks import MAX_MESSAGES, MAX_PARTS, MAX_STOP_CHARS, MAX_STOPS
from serve.options import ServeOptions
from serve.output import Output
from serve.tokenizer import Message

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
# serve.checks.text_bound of the longest prompt: one beside the smallest response region, one block
TEXT_BOUND = 2 * TOKENIZER.longest_token * (LIMITS.context_len - BLOCK)
BODY_BOUND = 6 * TEXT_BOUND + (1 << 20)


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeBackend]]:
    backend = FakeBackend()
    with app_server(backend) as (url, _):
        yield url, backend


def post(url: str, path: str, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kwargs)  # type: ignore[arg-type]


def error_of(response: httpx.Response) -> dict[str, object]:
    """OpenAI's error object, checked for its shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, object] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and "\n" not in error["message"]
    return error


def refused(response: httpx.Response, needle: str, param: str | None = None, status: int = 400) -> None:
    assert response.status_code == status, (needle, response.status_code, response.text[:300])
    error = error_of(response)
    assert needle in str(error["message"]), (needle, error)
    if param is not None:
        assert error["param"] == param, (param, error)


# ---- 1. bounded work per request ---------------------------------------------------------------------


def test_stop_strings_are_bounded_in_number_and_length(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    base = {"prompt": "x", "max_tokens": 64}
    refused(post(url, COMPLETIONS, {**base, "stop": ["a", "b", "c", "d", "e"]}), "at most 4 stop", "stop")
    long = "x" * (MAX_STOP_CHARS + 1)
    refused(post(url, COMPLETIONS, {**base, "stop": long}), f"{MAX_STOP_CHARS + 1} characters", "stop")
    refused(post(url, CHAT, {"messages": USER, "stop": ["ok", long]}), "beyond the bound", "stop")
    assert len(backend.submitted) == before
    most = ["\x00" * MAX_STOP_CHARS, "B" * 40, "\x01", "\x02"][:MAX_STOPS]
    reply = post(url, COMPLETIONS, {**base, "stop": most})  # block 0 is A*32, block 1 B*32
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "A" * 32 + "B" * 32


def test_matching_a_stop_string_is_linear_in_its_length() -> None:
    """The text is held back while its end may begin a stop string: finding how much took every prefix of
    the stop string (a 1,000,000-character one held the server 55 s); now each character once or twice."""

    class Counted(str):
        chars = 0

        def __getitem__(self, key: object) -> str:
            piece = str.__getitem__(self, key)  # type: ignore[index]
            Counted.chars += len(piece)
            return piece

    n = 1000
    a = TOKENIZER.encode("A")[0]
    stop = Counted("A" * (n - 1) + "B")  # the text, A after A, may begin it at every length
    output = Output(TOKENIZER, (), 64 * 32, (stop,))
    texts = [output.add_block([a] * 32, last=False) for _ in range(40)]
    assert texts[:31] == [""] * 31  # held back while the stop string may be under way
    assert "".join(texts) == "A" * (40 * 32 - (n - 1))
    assert Counted.chars < 4 * n * len(texts)  # every prefix of it took n * n / 2 characters a block


def test_messages_and_content_parts_are_bounded(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    many = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    refused(post(url, CHAT, {"messages": many}), f"at most {MAX_MESSAGES} messages", "messages")
    half = [{"type": "text", "text": ""}] * (MAX_PARTS // 2 + 1)
    parts = [{"role": "user", "content": half}, {"role": "user", "content": half}]
    refused(post(url, CHAT, {"messages": parts}), f"at most {MAX_PARTS} content parts", "messages")
    assert len(backend.submitted) == before
    fits = [{"role": "user", "content": [{"type": "text", "text": "a"}] * 8}] * 2
    assert post(url, CHAT, {"messages": fits, "max_tokens": 1}).status_code == 200


def test_a_body_of_more_json_than_a_request_uses_is_refused_before_it_is_parsed(
    fake: tuple[str, FakeBackend],
) -> None:
    """Parsing 170,000 empty messages held the event loop for seconds: the body's strings and values are
    counted first (the refusal names the count, which no parse error would). (170,000 would be beyond the
    bound of the body's size here, of a small model.)"""
    url, backend = fake
    before = len(backend.submitted)
    empty = [{"role": "user", "content": ""}] * 20_000
    refused(post(url, CHAT, {"messages": empty}), "JSON strings, beyond the bound")
    refused(post(url, COMPLETIONS, {"prompt": [1] * 100_000}), "JSON values, beyond the bound")
    nested = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = httpx.post(url + COMPLETIONS, content=nested, timeout=30)
    refused(response, "JSON values, beyond the bound")
    assert len(backend.submitted) == before
    # commas, brackets and escaped quotes inside a text are not values: the prompt's own bound refuses
    # this one (it has too many characters), not the count of values
    refused(post(url, COMPLETIONS, {"prompt": '[a], {"b"}, \\' * 2000}), "characters cannot fit")
    reply = post(url, COMPLETIONS, {"prompt": '[a], {"b"}, \\' * 20, "max_tokens": 1})
    assert reply.status_code == 200, reply.text


def test_a_body_beyond_the_longest_prompt_is_413_before_it_is_read(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    body = json.dumps({"prompt": "x", "user": "u" * BODY_BOUND}).encode()  # 170,000 messages: 5.6 MB
    response = httpx.post(url + COMPLETIONS, content=body, timeout=30)
    refused(response, f"beyond the bound of {BODY_BOUND}", status=413)
    assert response.headers["connection"] == "close"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is seen as the body arrives
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]

    response = httpx.post(url + COMPLETIONS, content=chunks(), timeout=30)
    refused(response, f"more than {BODY_BOUND} bytes", status=413)
    assert len(backend.submitted) == before
    fits = json.dumps({"prompt": "x", "max_tokens": 1, "user": "u" * (BODY_BOUND - 100)})
    assert httpx.post(url + COMPLETIONS, content=fits, timeout=30).status_code == 200


class HeldTokenizer:
    """The built-in tokenizer, whose encode of a long text waits until the test lets it go."""

    name, eos_id, longest_token = "held", TOKENIZER.eos_id, TOKENIZER.longest_token

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, text: str) -> list[int]:
        if len(text) >= serve_app.INLINE_CHARS:
            self.entered.set()
            assert self.release.wait(30)
        return TOKENIZER.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return TOKENIZER.decode(ids)

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        return self.encode(TOKENIZER._template.render(messages=chat, add_generation_prompt=True))


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_long_prompt_is_tokenized_off_the_event_loop(path: str) -> None:
    """While the tokenizer holds a long prompt, /health still answers (on the event loop it could not)."""
    text = "ab " * (serve_app.INLINE_CHARS // 2)
    body = {"prompt": text} if path == COMPLETIONS else {"messages": [{"role": "user", "content": text}]}
    tokenizer = HeldTokenizer()
    with app_server(FakeBackend(), tokenizer=tokenizer) as (url, _):  # type: ignore[arg-type]
        answers: list[httpx.Response] = []
        sender = threading.Thread(target=lambda: answers.append(post(url, path, {**body, "max_tokens": 1})))
        sender.start()
        try:
            assert tokenizer.entered.wait(30)
            assert httpx.get(url + "/health", timeout=10).status_code == 200
        finally:
            tokenizer.release.set()
            sender.join(30)
    assert answers[0].status_code in (200, 400), answers[0].text  # 400: too many tokens for the window


# ---- 2. timeouts ---------------------------------------------------------------------------------------

SHORT = ServeOptions(header_timeout=0.3, body_timeout=0.3, keep_alive_timeout=0.3)
WATCH_S = 3.0  # 10 times the timeouts (and short of uvicorn's 5 s keep-alive): still open then, not cut


def until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection; AssertionError if it is still open after
    WATCH_S seconds."""
    sock.settimeout(WATCH_S)
    received = b""
    try:
        while piece := sock.recv(65536):
            received += piece
    except TimeoutError:
        raise AssertionError(f"still open after {WATCH_S} s; received {received[:200]!r}") from None
    except ConnectionResetError:
        pass
    return received


def closing_answer(server: tuple[str, int], sent: bytes) -> tuple[bytes, dict[str, Any]]:
    """Send `sent` on a new connection; the head of what comes back until the server closes it, and the
    error of its JSON body."""
    with socket.create_connection(server) as sock:
        sock.sendall(sent)
        received = until_closed(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    return head, json.loads(body)["error"]


@pytest.fixture(scope="module")
def short() -> Iterator[tuple[str, int]]:
    with app_server(FakeBackend(), options=SHORT) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.mark.parametrize(
    "sent",
    [b"", HEAD, HEAD + b"content-length: 100\r\n\r\n" + b'{"prompt": "x", '],
    ids=["nothing", "partial headers", "partial body"],
)
def test_a_connection_whose_request_does_not_arrive_in_time_gets_408_and_is_closed(
    short: tuple[str, int], sent: bytes
) -> None:
    head, error = closing_answer(short, sent)
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower(), head
    assert error["code"] == 408 and "did not arrive within 0.3 s" in error["message"]


def test_headers_past_the_bound_get_431_and_the_connection_closes_while_others_are_served(
    short: tuple[str, int],
) -> None:
    """A header that never ends is refused once the headers pass MAX_HEADER_BYTES (httptools' time grows
    with the square of one header's length: 80 MiB stalled every other client for seconds); one of
    64 KiB is served."""
    from serve.server import MAX_HEADER_BYTES

    with socket.create_connection(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
        try:
            for _ in range(MAX_HEADER_BYTES // 4096 + 2):
                sock.sendall(b"a" * 4096)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us, as it should be: the answer is already in the socket's buffer
        with httpx.Client(base_url=f"http://{short[0]}:{short[1]}", timeout=10) as client:
            assert client.get("/health").status_code == 200  # another client meanwhile
        received = until_closed(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ") and b"connection: close" in head.lower(), received[:200]
    error = json.loads(body)["error"]
    assert error["code"] == 431 and f"headers over {MAX_HEADER_BYTES} bytes" in error["message"]
    with httpx.Client(base_url=f"http://{short[0]}:{short[1]}", timeout=10) as client:
        assert client.get("/health", headers={"x-big": "a" * 65536}).status_code == 200


class Transport(asyncio.Transport):
    """What a `TimedHttp` writes, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.written, self.closed = b"", False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.closed:  # as a socket's transport, which drops what is written after its close
            self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...


async def answering(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200 with nothing; /slow sends half its 4 bytes, and the rest a
    second later (a response under way while the next request arrives); /later begins a second later."""
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/later":
        await asyncio.sleep(1.0)
    if scope["path"] == "/slow":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"sl", "more_body": True})
        await asyncio.sleep(1.0)
        await send({"type": "http.response.body", "body": b"ow"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def fed(chunks: list[bytes | float], header_s: float = 10.0, body_s: float = 30.0) -> Transport:
    """What a `TimedHttp` (header and body timeouts `header_s`, `body_s`) serving `answering` writes when
    fed `chunks` as a socket may deliver them, 10 ms apart; a number among them is a pause of that long."""
    from uvicorn.server import ServerState

    from serve.server import timed_protocol

    protocol = timed_protocol(header_s, body_s, 5)
    config = uvicorn.Config(answering, http=protocol, lifespan="off", log_level="warning", access_log=False)
    config.load()
    http = protocol(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    transport = Transport()
    http.connection_made(transport)
    for chunk in chunks:
        if isinstance(chunk, float):
            await asyncio.sleep(chunk)
            continue
        http.data_received(chunk)
        await asyncio.sleep(0.01)  # the app answers
    return transport


def statuses(transport: Transport) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written)


def test_the_header_bound_counts_a_requests_own_headers_not_the_last_body() -> None:
    """Chunks fed to the protocol as a socket may deliver them: a keep-alive POST whose body ends in the
    chunk that begins the next request, whose headers end in the chunk after. That chunk's body bytes once
    counted toward the next request's headers (a 431)."""
    from serve.server import MAX_HEADER_BYTES

    body = MAX_HEADER_BYTES + 100
    get = b"GET /y HTTP/1.1\r\nhost: a\r\n\r\n"
    post = b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % body
    served = asyncio.run(fed([post, b"x" * body + get[:10], get[10:]]))
    assert statuses(served) == [b"200", b"200"] and not served.closed
    half = b"a" * (MAX_HEADER_BYTES // 2)
    endless = asyncio.run(fed([get[:20], half, half]))
    assert endless.written.startswith(b"HTTP/1.1 431 ") and endless.closed
    second = asyncio.run(fed([get, get[:20], half, half]))  # the bound holds for every request on it
    pad = b"x-pad: " + b"p" * 150_000 + b"\r\n"  # 150 kB of headers in each of two pipelined requests:
    first, then = get[:-2] + pad + b"\r\n", post.replace(b"%d" % body, b"3")[:-2] + pad + b"\r\n"
    pipelined = asyncio.run(
        fed([first + then[:20], then[20:], b"abc"])
    )  # the first's not counted for the second
    assert statuses(pipelined) == [b"200", b"200"], pipelined.written[-200:]
    slow = b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n"
    spliced = asyncio.run(fed([slow, get[:20], half, half]))  # refused while /slow's answer is under way:
    assert spliced.written.endswith(b"sl") and spliced.closed  # closed, no 431 written into that answer
    assert statuses(second) == [b"200", b"431"] and second.closed
    chunked = b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
    pieces = [b"1000\r\n" + b"x" * 4096 + b"\r\n"] * 100  # 400 KiB of body in ordinary chunks
    whole = asyncio.run(fed([chunked, *pieces, b"0\r\n\r\n", get]))
    assert statuses(whole) == [b"200", b"200"] and not whole.closed
    trailer = asyncio.run(fed([chunked, b"5\r\nhello\r\n0\r\nx-trailer: ", half, half]))  # parsed as headers
    assert trailer.written.startswith(b"HTTP/1.1 431 ") and trailer.closed


def test_a_pipelined_request_is_timed_and_refused_only_once_the_answer_ahead_is_sent() -> None:
    """A request pipelined behind a response not yet sent (which uvicorn may not read before) has its
    deadlines run from that response's end, and an error for it is never written into, or ahead of, the
    answer before it. Its body deadline once ran from its headers: a 408 landed inside /slow's answer."""
    slow = b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n"
    post = b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\n"
    late = asyncio.run(fed([slow + post, 1.1, b"abc"], body_s=0.3))  # the body 0.1 s after /slow's end
    assert statuses(late) == [b"200", b"200"] and b"\r\n\r\nslowHTTP/1.1 200" in late.written
    assert not late.closed
    never = asyncio.run(fed([slow + post, 1.5], body_s=0.3))  # the body never comes: 408 after the answer
    assert b"\r\n\r\nslowHTTP/1.1 408 " in never.written and statuses(never) == [b"200", b"408"]
    assert never.closed
    chunked = b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
    malformed = asyncio.run(fed([slow + chunked, b"zz\r\n"]))  # a bad chunk size while /slow is answered:
    assert malformed.written.endswith(b"\r\n\r\nsl") and malformed.closed  # closed, no 400 inside it
    get = b"GET /y HTTP/1.1\r\nhost: a\r\n\r\n"  # a third's headers stop short behind two answers:
    third = asyncio.run(fed([slow + get + get[:10], 1.6], header_s=0.3, body_s=5.0))  # its header deadline
    assert statuses(third) == [b"200", b"200", b"408"] and third.written.count(b"slow") == 1  # runs from
    assert b"the request's headers did not arrive within 0.3 s" in third.written and third.closed  # theirs
    later = b"GET /later HTTP/1.1\r\nhost: a\r\n\r\n"
    waiting = asyncio.run(fed([later + chunked, b"zz\r\n"]))  # before /later's answer began, a 400 would
    assert waiting.written == b"" and waiting.closed  # read as that answer


@pytest.mark.parametrize(
    "sent",
    [b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n",
     b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"],
    ids=["garbage request line", "negative content-length", "HTTP/2 preface"],
)  # fmt: skip
def test_a_request_httptools_cannot_parse_gets_400_json_and_the_connection_closes(
    short: tuple[str, int], sent: bytes
) -> None:
    head, error = closing_answer(short, sent)
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head, head
    assert error["message"] == "Invalid HTTP request received: malformed HTTP"


def test_an_idle_keep_alive_connection_is_closed(short: tuple[str, int]) -> None:
    with socket.create_connection(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200 ") and received.count(b"HTTP/1.1") == 1


def test_requests_in_time_are_served_on_one_connection(short: tuple[str, int]) -> None:
    with httpx.Client(base_url=f"http://{short[0]}:{short[1]}", timeout=10) as client:
        for _ in range(3):
            reply = client.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1})
            assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "A"


# ---- 3. strict types and OpenAI's shapes ---------------------------------------------------------------


def test_values_of_the_wrong_type_are_400_not_coerced(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    cases: list[tuple[str, dict[str, object], str]] = [
        (CHAT, {"messages": USER, "temperature": False}, "temperature"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": True}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": "1"}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": 1.0}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream"),
        (COMPLETIONS, {"prompt": [True]}, "prompt"),
        (COMPLETIONS, {"prompt": "x", "seed": "7"}, "seed"),
        (COMPLETIONS, {"prompt": "x", "echo": 1}, "echo"),
        (CHAT, {"messages": USER, "n": "1"}, "n"),
        (CHAT, {"messages": USER, "stream": True, "stream_options": {"include_usage": "yes"}},
         "stream_options.include_usage"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (CHAT, {"messages": USER, "stop": 5}, "stop"),
    ]  # fmt: skip
    for path, body, param in cases:
        refused(post(url, path, body), param, param)
    message = error_of(post(url, COMPLETIONS, {"prompt": [True]}))["message"]
    kinds = "a string, a list of strings, a list of token ids or a list of lists of token ids"
    assert message == f"prompt: must be {kinds}"
    assert len(backend.submitted) == before
    assert post(url, CHAT, {"messages": USER, "temperature": 1, "max_tokens": 1}).status_code == 200


def test_max_completion_tokens_is_checked_and_wins_over_max_tokens(fake: tuple[str, FakeBackend]) -> None:
    url, _ = fake
    for tokens in (
        {"max_tokens": 1, "max_completion_tokens": -5},
        {"max_tokens": 5, "max_completion_tokens": 0},
        {"max_completion_tokens": 129},
    ):
        refused(post(url, CHAT, {"messages": USER, **tokens}), "max_completion_tokens: must lie in [1, 128]",
                "max_completion_tokens")  # fmt: skip
    refused(post(url, CHAT, {"messages": USER, "max_tokens": -1, "max_completion_tokens": 5}), "max_tokens")
    reply = post(url, CHAT, {"messages": USER, "max_tokens": 100, "max_completion_tokens": 40}).json()
    assert reply["usage"]["completion_tokens"] == 40  # as vLLM: max_completion_tokens wins


def test_logprobs_take_their_own_json_types_only(fake: tuple[str, FakeBackend]) -> None:
    """A completion's `logprobs` is a count (0 asks for the chosen tokens' alone), chat's a boolean."""
    url, _ = fake
    refused(post(url, COMPLETIONS, {"prompt": "x", "logprobs": False}), "valid integer", "logprobs")
    refused(post(url, CHAT, {"messages": USER, "logprobs": 0}), "valid boolean", "logprobs")
    refused(post(url, CHAT, {"messages": USER, "logprobs": "true"}), "valid boolean", "logprobs")
    assert post(url, CHAT, {"messages": USER, "logprobs": False, "max_tokens": 1}).status_code == 200
    assert post(url, COMPLETIONS, {"prompt": "x", "logprobs": None, "max_tokens": 1}).status_code == 200
    assert post(url, COMPLETIONS, {"prompt": "x", "logprobs": 0, "max_tokens": 1}).status_code == 200
    refused(post(url, COMPLETIONS, {"prompt": "x", "best_of": True}), "best_of: not supported", "best_of")


def test_a_null_takes_the_fields_default_and_an_unknown_stream_option_is_refused(
    fake: tuple[str, FakeBackend],
) -> None:
    """OpenAI's nullable fields: null is the default (it was a 400 for n, stream, echo, ignore_eos, chat's
    logprobs and include_usage); a stream option Sangam does not know is named, not ignored."""
    url, _ = fake
    nulls = {"n": None, "stream": None, "ignore_eos": None}
    chat = post(url, CHAT, {"messages": USER, "max_tokens": 1, "logprobs": None, **nulls})
    assert chat.status_code == 200 and chat.json()["choices"][0]["logprobs"] is None, chat.text
    completion = post(url, COMPLETIONS, {"prompt": "x", "max_tokens": 1, "echo": None, **nulls})
    assert completion.status_code == 200 and completion.json()["choices"][0]["text"] == "A", completion.text
    refused(post(url, CHAT, {"messages": None}), "Field required", "messages")
    streamed = {"prompt": "x", "max_tokens": 1, "stream": True, "stream_options": {"include_usage": None}}
    chunks = post(url, COMPLETIONS, streamed)
    assert chunks.status_code == 200 and chunks.text.endswith("data: [DONE]\n\n")
    assert "usage" not in chunks.text  # include_usage null: false
    options = {"include_usage": True, "foo": 1}
    body = {"prompt": "x", "max_tokens": 1, "stream": True, "stream_options": options}
    refused(post(url, COMPLETIONS, body), "stream_options.foo: not supported", "stream_options.foo")
    options = {"include_usage": True, "include_obfuscation": True}
    refused(
        post(url, COMPLETIONS, body | {"stream_options": options}),
        "not supported",
        "stream_options.include_obfuscation",
    )
    neutral = body | {"stream_options": {"include_usage": True, "include_obfuscation": False}}
    assert post(url, COMPLETIONS, neutral).status_code == 200  # OpenAI's padding off: changes nothing


def test_an_unknown_model_is_404_model_not_found_and_served_names_are_listed() -> None:
    backend = FakeBackend()
    with app_server(backend, served_names=("first", "second")) as (url, _):
        response = post(url, COMPLETIONS, {"model": "gpt-4o", "prompt": "x"})
        assert response.status_code == 404
        error = error_of(response)
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "gpt-4o" in str(error["message"]) and "first, second" in str(error["message"])
        refused(post(url, CHAT, {"model": "fake-model", "messages": USER}), "does not exist", status=404)
        assert not backend.submitted
        for name in ("first", "second"):
            reply = post(url, CHAT, {"model": name, "messages": USER, "max_tokens": 1})
            assert reply.status_code == 200 and reply.json()["model"] == name
        assert post(url, COMPLETIONS, {"prompt": "x", "max_tokens": 1}).json()["model"] == "first"
        listed = httpx.get(url + "/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["first", "second"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve("second").id == "second"  # GET /v1/models/{model}
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("org/gpt-4o")
        assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
        assert httpx.head(url + "/health").status_code == 200  # load balancers' probes
        assert httpx.get(url + "/openapi.json").status_code == 404  # no schema pages, as no docs pages


def test_every_error_is_openai_shaped_404_and_405_included(fake: tuple[str, FakeBackend]) -> None:
    url, _ = fake
    missing = httpx.get(url + "/v1/nothing")
    refused(missing, "no such endpoint: GET /v1/nothing", status=404)
    wrong = httpx.get(url + COMPLETIONS)
    refused(wrong, "method not allowed: GET /v1/completions", status=405)
    assert wrong.headers["allow"] == "POST"
    assert error_of(wrong)["type"] == "MethodNotAllowedError"
    refused(httpx.put(url + "/health"), "method not allowed", status=405)


def test_messages_sangam_cannot_serve_are_named(fake: tuple[str, FakeBackend]) -> None:
    url, backend = fake
    before = len(backend.submitted)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases: list[tuple[list[dict[str, object]], str, str]] = [
        ([*USER, {"role": "tool", "content": "42", "tool_call_id": "c1"}],
         "a 'tool' message (a tool's result) is not supported", "messages.1.role"),
        ([{"role": "user", "content": None}], "null content is not supported", "messages.0.content"),
        ([{"role": "user"}], "null content is not supported", "messages.0.content"),
        ([*USER, {"role": "assistant", "content": None, "tool_calls": [call]}],
         "tool calls are not supported", "messages.1.tool_calls"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "only text parts are supported, not 'image_url'", "messages.0.content.0.type"),
        ([{"role": "user", "content": [{"type": "text"}]}], "a text part needs its text",
         "messages.0.content.0.text"),
        ([{"role": "user", "content": "x", "name": "bob"}], "not supported by Sangam", "messages.0.name"),
    ]  # fmt: skip
    for messages, needle, param in cases:
        refused(post(url, CHAT, {"messages": messages}), needle, param)
    assert len(backend.submitted) == before
    echoed = [*USER, {"role": "assistant", "content": "A", "refusal": None, "tool_calls": []}, *USER]
    assert post(url, CHAT, {"messages": echoed, "max_tokens": 1}).status_code == 200


def sse_chunks(url: str, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    with httpx.stream("POST", url + path, json=body, timeout=10) as response:
        assert response.status_code == 200, response.read()
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(
    fake: tuple[str, FakeBackend], path: str
) -> None:
    url, _ = fake
    body: dict[str, object] = {"prompt": "x"} if path == COMPLETIONS else {"messages": USER}
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = sse_chunks(url, path, {**body, "max_tokens": 70, "stream": True, "stream_options": options})
    usages = [c["usage"] for c in chunks]
    assert [u["completion_tokens"] for u in usages] == [32, 64, 70, 70]  # type: ignore[index]
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)  # type: ignore[index]
    assert chunks[-1]["choices"] == []
    plain = sse_chunks(url, path, {**body, "max_tokens": 70, "stream": True,
                                   "stream_options": {"include_usage": True}})  # fmt: skip
    assert ["usage" in c for c in plain] == [False, False, False, True]
    as_vllm = sse_chunks(url, path, {**body, "max_tokens": 70, "stream": True,
                                     "stream_options": {"continuous_usage_stats": True}})  # fmt: skip
    assert not any("usage" in c for c in as_vllm)  # as in vLLM, continuous usage needs include_usage
    refused(post(url, path, {**body, "stream_options": {"include_usage": True}}), "only allowed when stream",
            "stream_options")  # fmt: skip


# ---- 4. a client that leaves mid-body ------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_that_leaves_mid_body_is_routine_not_a_traceback() -> None:
    backend = FakeBackend()
    servers: list[uvicorn.Server] = []
    records = Records()
    logger = logging.getLogger("uvicorn.error")  # uvicorn's logging config, made as it starts, replaces
    try:  # the logger's handlers: this one goes after it
        with app_server(backend, servers=servers) as (url, state):
            logger.addHandler(records)
            host, port = url.removeprefix("http://").split(":")
            for _ in range(3):
                with socket.create_connection((host, int(port))) as sock:
                    sock.sendall(HEAD + b"content-length: 100\r\n\r\n" + b'{"prompt": "x", ')
                    deadline = time.monotonic() + 10
                    while not servers[0].server_state.tasks:  # the app is reading the body
                        assert time.monotonic() < deadline
                        time.sleep(0.01)
            deadline = time.monotonic() + 10
            while servers[0].server_state.tasks or servers[0].server_state.connections:
                assert time.monotonic() < deadline, "the requests were never ended"
                time.sleep(0.01)
            assert httpx.get(url + "/health").status_code == 200
            assert not backend.submitted and state.in_flight == 0
    finally:
        logger.removeHandler(records)
    assert not [r for r in records.records if r.levelno >= logging.WARNING], [
        r.getMessage() for r in records.records
    ]
