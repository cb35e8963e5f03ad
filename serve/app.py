"""The OpenAI-compatible HTTP API (FastAPI): `/v1/models`, `/v1/completions`, `/v1/chat/completions`,
`/health` and `/metrics`, over any `Backend` (the running scheduler, or a fake in tests).

A request's life here: the API key (401), the server's state (503 while starting, draining or failed),
the waiting line (429 with Retry-After beyond `max_waiting`), the body and the prompt against the
model's limits (400: every refusal the scheduler's admission would make, made before it is asked),
then Submit and the request's block updates. `max_tokens` becomes whole 32-token blocks, the request's own
mask buffer (at most `--mask-len`, which a request without `max_tokens` gets), and the text is cut at
`max_tokens` or at the model's EOS. A stream sends one SSE chunk per committed block (with its tokens'
log-probs, if asked: `serve.logprobs`), then the usage chunk if asked, then `data: [DONE]`. A client
that goes away (a closed stream or connection) cancels its request at the scheduler. `/health` and
`/metrics` need no API key.

No request holds the event loop for long, whatever it carries: the body is refused beyond the size the
longest prompt the model takes could need (413), and before it is parsed, beyond the JSON strings and
values a request can use (counted at memory speed: pydantic's parse of 170,000 empty messages held the
loop for a second); every field that a list is has a bound (4 stop strings of at most 1,024 characters,
2,048 messages and 2,048 content parts); a stop string is matched in time linear in its length; and a
long prompt is tokenized on a thread, by a tokenizer that lets go of the GIL meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from executor.control.client import SangamError
from executor.control.messages import (
    MAX_TOP_LOGPROBS,
    ClusterStatus,
    Logprobs,
    RequestState,
    Sampling,
    Submission,
    WorkerState,
)
from sangam.hardware import BLOCK, pages_for
from sangam.request import response_region
from serve import protocol as api
from serve.backend import Backend, Limits, ServingState, ShutDown
from serve.logprobs import OutputLogprobs
from serve.metrics import CONTENT_TYPE, Metrics
from serve.tokenizer import Message, TextTokenizer

RETRY_AFTER_S = 1
CONTEXT_IDS = 4  # settled ids decoded again with new ones: a tokenizer may join a text to the one before
REQUEST_ID_HEADER = "x-sangam-request-id"
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}

# ---- bounds of a request (see the module's docstring) ---------------------------------------------------
MAX_STOPS = 4  # stop strings: OpenAI's bound
MAX_STOP_CHARS = 1024  # characters of one stop string
MAX_MESSAGES = 2048
MAX_PARTS = 2048  # content parts of all a request's messages
MAX_COMPLETION_LOGPROBS = 5  # a completion's `logprobs`: OpenAI's bound (chat's top_logprobs: 20)
# JSON strings and values (commas, brackets and braces outside strings) a body may hold before it is
# parsed: every message and part with its keys, and a few hundred more; values also a prompt of token ids
MAX_JSON_STRINGS = 4 * (MAX_MESSAGES + MAX_PARTS) + 256
MAX_JSON_VALUES = 3 * (MAX_MESSAGES + MAX_PARTS) + 256  # plus the model's context window
JSON_BYTES_PER_CHAR = 6  # a character escaped as \uXXXX (a client's json.dumps escapes every non-ASCII one)
BODY_SLACK = 1 << 20  # bytes beyond the longest prompt's text: ids, messages and the other fields
INLINE_CHARS = 2048  # a prompt of fewer characters is tokenized on the event loop (a thread costs more)


class APIError(Exception):
    """A request refused or failed: OpenAI's error JSON with this status (`code`: the status, or OpenAI's
    name of the error). `close`: the connection closes after the answer (a body left unread)."""

    def __init__(
        self, status: int, message: str, param: str | None = None, *, code: str | None = None,
        close: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.close = status, message, param, code, close

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        body = api.ErrorResponse(
            error=api.ErrorBody(message=self.message, type=ERROR_TYPES.get(self.status, "APIError"),
                                param=self.param, code=self.code or self.status)
        )  # fmt: skip
        headers = dict(headers or {})
        if self.status in (429, 503):
            headers["Retry-After"] = str(RETRY_AFTER_S)
        if self.close:
            headers["Connection"] = "close"
        return JSONResponse(body.model_dump(), status_code=self.status, headers=headers or None)


@dataclass(frozen=True, slots=True)
class AppConfig:
    model: str  # the served model's name
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on /v1/*
    max_waiting: int = 256  # queued requests beyond which new ones get 429
    served_names: tuple[str, ...] = ()  # the names a request's `model` may give (default: `model`)

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_names or (self.model,)


@dataclass(frozen=True, slots=True)
class Added:
    """What one committed block adds to a request's output: its text, and the log-probs of the request's
    tokens so far (None unless asked)."""

    text: str
    logprobs: Logprobs | None


@dataclass(frozen=True, slots=True)
class Job:
    """One admitted request, as the app runs it."""

    request_id: int
    prompt_tokens: int
    max_tokens: int
    started: float  # monotonic, when the HTTP request arrived

    @property
    def headers(self) -> dict[str, str]:
        """The scheduler's id of the request (its row in `--out`'s requests.csv)."""
        return {REQUEST_ID_HEADER: str(self.request_id)}


class Output:
    """The text of a request's committed blocks, cut at the model's EOS, at `max_tokens` or before the first
    of the `stops` strings; each block gives the text it adds. Text that may be the start of a stop string
    (or a trailing incomplete UTF-8 character, which decodes as one U+FFFD that bytes that follow may
    complete) waits for the next block: the texts added join to the whole text. Each block decodes its
    own ids and a few before them, not the whole output again (which made a long output quadratic)."""

    def __init__(
        self, tokenizer: TextTokenizer, eos_ids: Sequence[int], max_tokens: int, stops: Sequence[str] = ()
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.max_tokens = max_tokens
        self.stops = tuple(stops)
        self._borders = [borders(stop) for stop in self.stops]
        self.ids: list[int] = []
        self.eos = False
        self.finish: str | None = None  # stop (EOS or a stop string) or length
        self.sent = ""
        self._settled = 0  # ids whose text can no longer change: `_settled_text`
        self._settled_text = ""

    @property
    def completion_tokens(self) -> int:
        return len(self.ids) + self.eos  # the EOS counts as generated, as in vLLM

    def add_block(self, block: Sequence[int], last: bool) -> str:
        """The text `block` adds; nothing once the output is final (EOS, a stop, or max_tokens)."""
        if self.finish is not None:
            return ""
        before = len(self.ids)
        for token in block:
            if token in self.eos_ids:
                self.eos, self.finish = True, "stop"
                break
            self.ids.append(token)
            if len(self.ids) >= self.max_tokens:
                self.finish = "length"
                break
        if self.finish is None and last:
            self.finish = "length"
        text = self._decode()
        if self.stops:
            text = self._cut_at_stop(text, before)
        if self.finish is None:
            if text.endswith("\ufffd"):
                text = text[:-1]  # perhaps a character whose last bytes come with the next block
            text = text[: max(len(self.sent), len(text) - self._stop_prefix(text))]
        if not text.startswith(self.sent):  # a tokenizer that rewrites earlier text: send nothing new
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def _decode(self) -> str:
        """The text of all the ids: the settled text, then the ids after it decoded with the last few
        settled ones as context, unless the context has no text (special tokens: a decoder would then
        take the first new token for the text's first, whose leading space it drops) or the new ids
        changed it; then all the ids. It settles unless it holds a U+FFFD (an incomplete character, or
        bytes a later one may turn into U+FFFDs with it)."""
        start = max(0, self._settled - CONTEXT_IDS)
        context = self.tokenizer.decode(self.ids[start : self._settled])
        window = self.tokenizer.decode(self.ids[start:])
        if (context or not start) and window.startswith(context):
            text = self._settled_text + window[len(context) :]
        else:
            text = window = self.tokenizer.decode(self.ids)
        if "\ufffd" not in window:
            self._settled, self._settled_text = len(self.ids), text
        return text

    def _cut_at_stop(self, text: str, before: int) -> str:
        """`text` up to the first stop string, which ends the output (the tokens counted are those up to
        the one that completed it; `before` ids came with earlier blocks, which completed none)."""
        found = [i for i in (text.find(stop, len(self.sent)) for stop in self.stops) if i >= 0]
        if not found:
            return text
        cut = min(found)
        for n in range(before + 1, len(self.ids) + 1):
            if any(stop in self.tokenizer.decode(self.ids[:n])[len(self.sent) :] for stop in self.stops):
                del self.ids[n:]
                break
        self.finish, self.eos = "stop", False
        return text[:cut]

    def _stop_prefix(self, text: str) -> int:
        """How many characters at the end of `text` could begin a stop string."""
        return max(map(partial(stop_begun, text), self.stops, self._borders), default=0)


def borders(stop: str) -> list[int]:
    """Knuth-Morris-Pratt's table of `stop`: item i is the length of the longest proper prefix of
    `stop[: i + 1]` that also ends it."""
    table = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = table[k - 1]
        if stop[i] == stop[k]:
            k += 1
        table[i] = k
    return table


def stop_begun(text: str, stop: str, table: Sequence[int]) -> int:
    """The length of the longest proper prefix of `stop` that ends `text`: `stop`'s automaton run over
    the text's last `len(stop) - 1` characters, from the first that begins `stop`, in time linear in
    `len(stop)` (trying every prefix was quadratic: a 1,000,000-character stop string held the server for
    55 s)."""
    tail = text[max(0, len(text) - len(stop) + 1) :]
    start = tail.find(stop[0]) if tail else -1
    if start < 0:
        return 0
    k = 0
    for char in tail[start:]:
        while k and char != stop[k]:
            k = table[k - 1]
        if char == stop[k]:
            k += 1
            if k == len(stop):  # the whole stop string: `_cut_at_stop` ended the text before it
                k = table[k - 1]
    return k


def create_app(backend: Backend, tokenizer: TextTokenizer, state: ServingState, config: AppConfig) -> FastAPI:
    """The HTTP app over `backend`; `state` is shared with whoever starts and drains the cluster."""
    app = FastAPI(title="Sangam", docs_url=None, redoc_url=None, openapi_url=None)
    names = config.names
    metrics = Metrics(names[0])
    background: set[asyncio.Task[None]] = set()
    # one thread: a tokenizer need not be safe to share between threads (transformers' is not)
    tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, err: HTTPException) -> JSONResponse:
        """Starlette's own (no such path, a method the path does not take) in OpenAI's shape."""
        where = f"{request.method} {request.url.path}"
        message = {404: f"no such endpoint: {where}", 405: f"method not allowed: {where}"}
        return APIError(err.status_code, message.get(err.status_code, str(err.detail))).response(err.headers)

    @app.exception_handler(Exception)
    async def on_bug(request: Request, err: Exception) -> JSONResponse:
        """A bug: OpenAI's shape for the client (Starlette logs the traceback)."""
        return APIError(500, f"internal server error: {type(err).__name__}").response()

    if config.api_key is not None:
        app.add_middleware(RequireKey, key=config.api_key)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        reason = state.unavailable()
        if reason is None:
            try:
                status = await backend.status()
            except SangamError as err:
                reason = f"the scheduler does not answer: {err}"
            else:
                reason = unhealthy(status)
        if reason is not None:
            return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def scrape() -> Response:
        workers: tuple[WorkerState, ...] = ()
        if state.limits is not None and not state.failure:
            with contextlib.suppress(SangamError):
                workers = (await backend.status()).workers
        return Response(metrics.scrape(state.waiting, state.running, workers), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> api.ModelList:
        limits = ready()
        created = int(time.time())
        return api.ModelList(
            data=[api.ModelCard(id=name, created=created, max_model_len=limits.context_len) for name in names]
        )

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> api.ModelCard:
        """One served model (the openai client's `models.retrieve`); 404 `model_not_found` otherwise."""
        limits = ready()
        return api.ModelCard(id=served(model), created=int(time.time()), max_model_len=limits.context_len)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        started = time.monotonic()
        limits = ready()
        body = await parsed(request, api.CompletionRequest, limits, tokenizer)
        name = served(body.model)
        max_tokens = check_fields(body, limits)
        top = check_completion_logprobs(body)
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        chars = sum(len(t) for t in texts if isinstance(t, str))
        check_text_length(chars, tokenizer, limits, response_region(max_tokens))
        prompt = await tokenized(chars, completion_prompt, body.prompt, tokenizer)
        job = await admit(body, prompt, max_tokens, limits, started, top)
        created, rid = int(time.time()), f"cmpl-{uuid.uuid4().hex}"
        output = Output(tokenizer, () if body.ignore_eos else limits.eos_ids, job.max_tokens, body.stops)
        scores = OutputLogprobs(tokenizer) if top is not None else None
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(prompt)

        def scored(logprobs: Logprobs | None) -> api.CompletionLogprobs | None:
            return None if scores is None else scores.completion(output.ids, asked(logprobs))

        def chunk(added: Added, finish: str | None) -> api.CompletionChunk:
            nonlocal echo
            choice = api.CompletionChoice(
                text=echo + added.text, logprobs=scored(added.logprobs), finish_reason=finish
            )
            echo = ""  # the prompt goes with the first chunk
            return api.CompletionChunk(id=rid, created=created, model=name, choices=[choice])

        if body.stream:
            return sse(job, output, chunk, body, rid, created, name, request, api.CompletionChunk)
        logprobs = await until_done(job, output, request)

        def respond() -> Response:
            choice = api.CompletionChoice(
                text=echo + output.sent, logprobs=scored(logprobs), finish_reason=output.finish
            )
            return json_response(
                api.CompletionResponse(
                    id=rid, created=created, model=name, choices=[choice], usage=usage(job, output)
                ),
                job.headers,
            )

        return respond() if scores is None else await off_loop(respond)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        started = time.monotonic()
        limits = ready()
        body = await parsed(request, api.ChatRequest, limits, tokenizer)
        name = served(body.model)
        max_tokens = check_fields(body, limits)
        top = check_chat_logprobs(body)
        check_messages(body.messages)
        messages = [Message(m.role, m.text) for m in body.messages]
        chars = sum(len(m.content) for m in messages)
        check_text_length(chars, tokenizer, limits, response_region(max_tokens))
        prompt = await tokenized(chars + len(messages), tokenizer.chat_prompt, messages)
        job = await admit(body, prompt, max_tokens, limits, started, top)
        created, rid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
        output = Output(tokenizer, () if body.ignore_eos else limits.eos_ids, job.max_tokens, body.stops)
        scores = OutputLogprobs(tokenizer) if top is not None else None
        first = True

        def scored(logprobs: Logprobs | None) -> api.ChatLogprobs | None:
            return None if scores is None else scores.chat(output.ids, asked(logprobs))

        def chunk(added: Added, finish: str | None) -> api.ChatChunk:
            nonlocal first
            delta = api.Delta(role="assistant" if first else None, content=added.text)
            first = False
            choice = api.ChatChunkChoice(delta=delta, logprobs=scored(added.logprobs), finish_reason=finish)
            return api.ChatChunk(id=rid, created=created, model=name, choices=[choice])

        if body.stream:
            return sse(job, output, chunk, body, rid, created, name, request, api.ChatChunk)
        logprobs = await until_done(job, output, request)

        def respond() -> Response:
            choice = api.ChatChoice(
                message=api.AssistantMessage(content=output.sent), logprobs=scored(logprobs),
                finish_reason=output.finish,
            )  # fmt: skip
            return json_response(
                api.ChatResponse(
                    id=rid, created=created, model=name, choices=[choice], usage=usage(job, output)
                ),
                job.headers,
            )

        return respond() if scores is None else await off_loop(respond)

    # ---- admission ------------------------------------------------------------------------------------

    def ready() -> Limits:
        reason = state.unavailable()
        if reason is not None:
            raise APIError(503, reason)
        assert state.limits is not None
        return state.limits

    def served(model: str | None) -> str:
        """The name of the model the request asks for (none: the first served name); 404 if not served."""
        if model is None:
            return names[0]
        if model not in names:
            raise APIError(404, f"the model `{model}` does not exist (served: {', '.join(names)})", "model",
                           code="model_not_found")  # fmt: skip
        return model

    async def off_loop(respond: Callable[[], Response]) -> Response:
        """A whole response's log-probs scored (the tokenizer decodes every candidate) and serialized on the
        tokenizing thread: up to 1,024 tokens x 20 candidates held every other client for 0.1-0.4 s on the
        event loop."""
        return await asyncio.get_running_loop().run_in_executor(tokenizing, respond)

    async def tokenized(chars: int, encode: Callable[..., list[int]], *args: Any) -> list[int]:
        """`encode(*args)`: on the event loop for a short text, else on the tokenizing thread (the
        built-in and transformers' fast tokenizers let go of the GIL while they encode)."""
        if chars < INLINE_CHARS:
            return encode(*args)
        return await asyncio.get_running_loop().run_in_executor(tokenizing, encode, *args)

    async def admit(
        body: api.Sampling, prompt: list[int], max_tokens: int, limits: Limits, started: float,
        logprobs: int | None,
    ) -> Job:  # fmt: skip
        """Check the prompt, then Submit the request, its mask buffer `max_tokens` in whole blocks
        (`logprobs`: the alternatives per token asked for, None: no log-probs); APIError for every
        refusal."""
        gen_len = response_region(max_tokens)
        check_prompt(prompt, limits, gen_len)
        if state.waiting >= config.max_waiting:
            raise APIError(
                429, f"{state.waiting} requests are waiting already (--max-waiting {config.max_waiting})"
            )
        n_blocks = gen_len // BLOCK
        forwards = (body.forwards_per_block,) * n_blocks if body.forwards_per_block is not None else ()
        sampling = Sampling(body.threshold, body.temperature, body.seed, logprobs)
        state.admitting += 1
        try:
            result = await backend.submit(Submission(tuple(prompt), gen_len, sampling, forwards))
        except SangamError as err:
            raise scheduler_error(err) from None
        finally:
            state.admitting -= 1
        if result.status == "ERROR":  # the scheduler's admission: a check the HTTP layer does not make
            raise APIError(400, result.error)
        state.requests[result.request_id] = result.status
        return Job(result.request_id, len(prompt), max_tokens, started)

    # ---- running --------------------------------------------------------------------------------------

    async def blocks(job: Job, output: Output) -> AsyncIterator[Added]:
        """What each committed block adds, until the output is final; the request's metrics once it
        ends, and a cancel at the scheduler if the caller stops listening before that."""
        last: RequestState | None = None
        reason, consumed = "abort", 0
        try:
            try:
                async for update in backend.stream(job.request_id):
                    last = update
                    if update.status in ("QUEUED", "RUNNING"):
                        state.requests[job.request_id] = update.status
                    while consumed < update.blocks_done and output.finish is None:
                        final = update.status == "DONE" and consumed + 1 == update.blocks_done
                        block = update.token_ids[BLOCK * consumed : BLOCK * (consumed + 1)]
                        yield Added(output.add_block(block, final), update.logprobs)
                        consumed += 1
                    if output.finish is not None:
                        reason = output.finish
                        return
                    if update.status == "ERROR":
                        reason = "error"
                        raise APIError(500, f"the request failed: {update.error}")
            except ShutDown as err:  # the drain's deadline: the cluster stops next
                raise APIError(503, str(err)) from None
            except SangamError as err:
                reason = "error"
                raise APIError(503, f"the scheduler stopped answering: {err}") from None
        finally:
            end(job, output, last, reason)

    def end(job: Job, output: Output, last: RequestState | None, reason: str) -> None:
        """The request is over for its client (once; later calls do nothing): its metrics, and a cancel
        at the scheduler unless it ended there (the client left, or the output ended early)."""
        if state.requests.pop(job.request_id, None) is None:
            return
        if last is None or last.status not in ("DONE", "ERROR"):
            later(backend.cancel, job.request_id)
        metrics.finished(
            last, time.monotonic() - job.started, reason, job.prompt_tokens, output.completion_tokens
        )

    async def until_done(job: Job, output: Output, request: Request) -> Logprobs | None:
        """Run the request to its end, or cancel it if the client disconnects first; the log-probs of its
        tokens (None unless asked)."""
        logprobs: Logprobs | None = None

        async def consume() -> None:
            nonlocal logprobs
            async for added in blocks(job, output):
                logprobs = added.logprobs

        run = asyncio.ensure_future(consume())
        gone = asyncio.ensure_future(disconnected(request))
        await asyncio.wait((run, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not run.done():
            run.cancel()
            end(job, output, None, "abort")  # also if the task was cancelled before it started
            raise APIError(400, "the client disconnected")
        run.result()
        return logprobs

    def sse(
        job: Job, output: Output, chunk: Callable[[Added, str | None], Any], body: api.Sampling,
        rid: str, created: int, name: str, request: Request, kind: type[api.ChatChunk | api.CompletionChunk],
    ) -> StreamingResponse:  # fmt: skip
        include_usage, continuous = body.include_usage, body.continuous_usage

        async def events() -> AsyncIterator[str]:
            last_write = ""  # the last block's chunk, the usage chunk and [DONE] go out in one write
            try:
                async for added in blocks(job, output):
                    block = chunk(added, output.finish)
                    if continuous:
                        block.usage = usage(job, output)
                    event = event_of(block.model_dump_json(exclude=None if continuous else {"usage"}))
                    if output.finish is None:
                        yield event
                    else:
                        last_write = event
                if include_usage:
                    final = kind(id=rid, created=created, model=name, choices=[], usage=usage(job, output))
                    last_write += event_of(final.model_dump_json())
            except APIError as err:
                last_write += event_of(json.dumps({"error": json.loads(bytes(err.response().body))["error"]}))
            yield last_write + "data: [DONE]\n\n"

        return ClosingStream(
            events(),
            lambda: end(job, output, None, "abort"),
            media_type="text/event-stream",
            headers=job.headers,
        )

    def later(call: Callable[[int], Coroutine[Any, Any, None]], request_id: int) -> None:
        """Run `call(request_id)` to its end even if the task that started it is being cancelled (made
        in its own task: a task the loop's end cancels before it ran leaves no coroutine unawaited)."""

        async def quietly() -> None:
            with contextlib.suppress(SangamError):  # the scheduler is gone: so is the request
                await call(request_id)

        task = asyncio.get_running_loop().create_task(quietly())
        background.add(task)
        task.add_done_callback(background.discard)

    return app


def check_fields(body: api.Sampling, limits: Limits) -> int:
    """The request's max_tokens (none given: the largest mask buffer, `--mask-len`), after the checks of
    its fields the scheduler's admission makes and of the fields Sangam does not implement; APIError(400)
    else."""
    unsupported = body.unsupported()
    if unsupported is not None:
        raise APIError(400, f"{unsupported}: not supported by Sangam", unsupported)
    stops = body.stops
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"stop: at most {MAX_STOPS} stop strings, got {len(stops)}", "stop")
    if not all(stops):
        raise APIError(400, "stop: a stop string is empty", "stop")
    longest = max(map(len, stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise APIError(400, f"stop: a stop string has {longest} characters, beyond the bound of "
                       f"{MAX_STOP_CHARS}", "stop")  # fmt: skip
    if body.n != 1:
        raise APIError(400, f"n: only n=1 is supported, got {body.n}", "n")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only allowed when stream is true", "stream_options")
    given: int | None = None
    for field in ("max_tokens", "max_completion_tokens"):  # the second wins, as in vLLM
        value: int | None = getattr(body, field, None)
        if value is not None and not 0 < value <= limits.mask_len:
            raise APIError(
                400, f"{field}: must lie in [1, {limits.mask_len}] (the mask buffer), got {value}", field
            )
        given = value if value is not None else given
    return limits.mask_len if given is None else given


def check_chat_logprobs(body: api.ChatRequest) -> int | None:
    """The alternatives per token a chat asks the log-probs of (None: no log-probs), within OpenAI's
    bounds; APIError(400) else."""
    top = body.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"top_logprobs: must lie in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs")
    if top and not body.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
    return (top or 0) if body.logprobs else None


def check_completion_logprobs(body: api.CompletionRequest) -> int | None:
    """The alternatives per token a completion asks the log-probs of (None: no log-probs), within OpenAI's
    bound; APIError(400) else."""
    top = body.logprobs
    if top is not None and not 0 <= top <= MAX_COMPLETION_LOGPROBS:
        raise APIError(400, f"logprobs: must lie in [0, {MAX_COMPLETION_LOGPROBS}], got {top}", "logprobs")
    if top is not None and body.echo:
        raise APIError(400, "echo: with logprobs, not supported by Sangam: the prompt's tokens get no "
                       "log-probs", "echo")  # fmt: skip
    return top


def asked(logprobs: Logprobs | None) -> Logprobs:
    """The log-probs a request asked for, which the scheduler's states carry from its first block on."""
    if logprobs is None:
        raise APIError(500, "the scheduler sent no log-probs for a request that asked for them")
    return logprobs


def check_messages(messages: Sequence[api.ChatMessage]) -> None:
    """A chat's messages are what Sangam serves: known roles, text content; APIError(400) naming the
    first that is not."""
    if not messages:
        raise APIError(400, "messages: at least one message is required", "messages")
    if len(messages) > MAX_MESSAGES:
        raise APIError(400, f"messages: at most {MAX_MESSAGES} messages, got {len(messages)}", "messages")
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    if parts > MAX_PARTS:
        raise APIError(400, f"messages: at most {MAX_PARTS} content parts in all, got {parts}", "messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if message.role in api.TOOL_ROLES:
            raise APIError(400, f"{where}.role: a {message.role!r} message (a tool's result) is not "
                           "supported: Sangam does not implement tool calling", f"{where}.role")  # fmt: skip
        if message.role not in api.ROLES:
            raise APIError(400, f"{where}.role: unknown role {message.role!r} "
                           f"(known: {', '.join(api.ROLES)})", f"{where}.role")  # fmt: skip
        extra = next((k for k, v in (message.model_extra or {}).items() if v not in (None, [])), None)
        if extra is not None:
            why = "tool calls are not supported: Sangam does not implement tool calling"
            raise APIError(400, f"{where}.{extra}: " + (why if extra in ("tool_calls", "function_call")
                           else "not supported by Sangam"), f"{where}.{extra}")  # fmt: skip
        if message.content is None:
            raise APIError(400, f"{where}.content: null content is not supported: a message needs its text "
                           "(a string or text parts)", f"{where}.content")  # fmt: skip
        for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
            if part.type != "text":
                raise APIError(400, f"{where}.content.{j}.type: only text parts are supported, not "
                               f"{part.type!r}", f"{where}.content.{j}.type")  # fmt: skip
            if part.text is None:
                raise APIError(400, f"{where}.content.{j}.text: a text part needs its text",
                               f"{where}.content.{j}.text")  # fmt: skip
            extra = next((k for k, v in (part.model_extra or {}).items() if v is not None), None)
            if extra is not None:
                raise APIError(400, f"{where}.content.{j}.{extra}: not supported by Sangam",
                               f"{where}.content.{j}.{extra}")  # fmt: skip


def check_prompt(prompt: Sequence[int], limits: Limits, mask_len: int) -> None:
    """The prompt's checks the scheduler's admission makes, beside a mask buffer of `mask_len` tokens;
    APIError(400) else."""
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    if min(prompt) < 0 or max(prompt) >= limits.vocab or limits.mask_id in prompt:  # scans in C
        bad = next(i for i, t in enumerate(prompt) if not 0 <= t < limits.vocab or t == limits.mask_id)
        token = prompt[bad]
        what = (
            "is the mask id" if token == limits.mask_id else f"is outside the vocabulary [0, {limits.vocab})"
        )
        raise APIError(400, f"prompt token {token} at position {bad} {what}", "prompt")
    if len(prompt) + mask_len > limits.context_len:
        raise APIError(
            400, f"the prompt is too long: {len(prompt)} tokens plus the {mask_len}-token mask buffer "
            f"exceed the model's context window of {limits.context_len} tokens", "prompt",
        )  # fmt: skip
    if pages_for(len(prompt) + mask_len) > limits.pages:
        raise APIError(
            400, f"the prompt is too long for a worker's KV pool: {len(prompt)} tokens plus the "
            f"{mask_len}-token mask buffer need {pages_for(len(prompt) + mask_len)} pages, a "
            f"worker holds {limits.pages}", "prompt",
        )  # fmt: skip


TEXT_SLACK = 2  # a normaliser may shrink a text before it is tokenized (composed characters)


def text_bound(tokenizer: TextTokenizer, limits: Limits, mask_len: int) -> int:
    """The characters of the longest prompt that may fit beside a mask buffer of `mask_len` tokens: its
    room in the context window at the longest token's length."""
    return TEXT_SLACK * tokenizer.longest_token * (limits.context_len - mask_len)


def check_text_length(chars: int, tokenizer: TextTokenizer, limits: Limits, mask_len: int) -> None:
    """Refuse a prompt of more characters than `text_bound`, before it is tokenized (a 4 MB prompt
    took 6 s to tokenize; one under the bound still takes a fraction of a second, on a thread)."""
    room = limits.context_len - mask_len
    if chars > text_bound(tokenizer, limits, mask_len):
        raise APIError(
            400, f"the prompt is too long: {chars} characters cannot fit in the {room} tokens the model's "
            f"context window leaves beside the {mask_len}-token mask buffer", "prompt",
        )  # fmt: skip


def completion_prompt(
    prompt: str | list[str] | list[int] | list[list[int]], tokenizer: TextTokenizer
) -> list[int]:
    """Token ids of a completion's prompt: text, or ids; one prompt per request."""
    if not prompt:
        return []
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt[0], int):  # the protocol's validation made the list all ints or all else
        return list(prompt)
    if len(prompt) != 1:
        raise APIError(400, f"prompt: one prompt per request, got {len(prompt)}", "prompt")
    (only,) = prompt
    return tokenizer.encode(only) if isinstance(only, str) else list(only)


def usage(job: Job, output: Output) -> api.Usage:
    generated = output.completion_tokens
    return api.Usage(prompt_tokens=job.prompt_tokens, completion_tokens=generated,
                     total_tokens=job.prompt_tokens + generated)  # fmt: skip


def scheduler_error(err: SangamError) -> APIError:
    if err.code == "RESOURCE_EXHAUSTED":
        return APIError(429, f"the scheduler is at its limit of concurrent calls: {err}")
    return APIError(503, f"the scheduler cannot take the request: {err}")


def event_of(payload: str) -> str:
    """One SSE event carrying `payload` (JSON)."""
    return f"data: {payload}\n\n"


M = TypeVar("M", bound=BaseModel)


async def parsed(request: Request, model: type[M], limits: Limits, tokenizer: TextTokenizer) -> M:
    """The request's JSON body as `model` (parsed and validated by pydantic in one pass, without FastAPI's
    body machinery, which took most of a millisecond); APIError(400) naming the first bad field. A body
    sent as another media type is refused (415), as FastAPI does: a web page may send any site a form
    or text body without asking first, but not a JSON one. The body's size (413) and its count of JSON
    values (400) are bounded before it is parsed (its max_tokens not yet known: for the prompt the
    shortest mask buffer leaves room for)."""
    kind = request.headers.get("content-type")
    if kind is not None:
        media = kind.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise APIError(415, f"the body must be JSON (Content-Type: application/json), not {media}")
    body = await read_body(request, JSON_BYTES_PER_CHAR * text_bound(tokenizer, limits, BLOCK) + BODY_SLACK)
    check_json_size(body, MAX_JSON_STRINGS, MAX_JSON_VALUES + limits.context_len)
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ())]
        union = next((i for i, p in enumerate(loc) if is_union_tag(p)), None)
        if union is not None:  # a value none of a union's types takes: the field, and what it takes
            where = ".".join(loc[:union])
            message = f"{where}: must be {UNIONS.get(loc[union - 1] if union else '', 'of another type')}"
        else:
            where = ".".join(loc)
            message = f"{where}: {first['msg']}" if where else str(first["msg"])
        raise APIError(400, message, where or None) from None


UNIONS = {  # what a field of several types takes, in words
    "prompt": "a string, a list of strings, a list of token ids or a list of lists of token ids",
    "stop": "a string or a list of strings",
    "content": "a string or a list of content parts",
}


def is_union_tag(part: str) -> bool:
    """pydantic's name of one type of a union in an error's location (`str`, `list[int]`, ...)."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part


async def read_body(request: Request, limit: int) -> bytes:
    """The body, if it holds at most `limit` bytes (413 else, before the rest is read: the connection
    closes). A client that leaves before its body has arrived is routine, not a traceback."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the body has {declared} bytes, beyond the bound of {limit}", close=True)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the body has more than {limit} bytes", close=True)
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(400, "the client disconnected before its body had arrived") from None
    return b"".join(chunks)


def check_json_size(body: bytes, max_strings: int, max_values: int) -> None:
    """Refuse a body of more JSON strings or other values than a request can use before it is parsed, by
    counting bytes (at memory speed): its strings are the quotes not escaped, two each; its other values
    are at most the commas, brackets and braces outside strings, plus one. (The text inside strings may
    hold any of them.)"""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then quotes
    quotes = body.count(b'"')
    if quotes // 2 > max_strings:
        raise APIError(400, f"the body holds {quotes // 2} JSON strings, beyond the bound of {max_strings}")
    outside = b"".join(body.split(b'"')[::2])
    values = outside.count(b",") + outside.count(b"[") + outside.count(b"{")
    if values > max_values:
        raise APIError(400, f"the body holds {values} JSON values, beyond the bound of {max_values}")


def json_response(body: BaseModel, headers: dict[str, str]) -> Response:
    return Response(body.model_dump_json(), media_type="application/json", headers=headers)


async def disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class RequireKey:
    """ASGI middleware: `/v1/*` needs `Authorization: Bearer KEY` (401 before the body is read)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = APIError(401, "missing or wrong API key (Authorization: Bearer KEY)").response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def unhealthy(status: ClusterStatus) -> str | None:
    """Why the cluster is not healthy (`/health` 503), or None: every worker registered and not lost. A
    lost worker's reason is the scheduler's (e.g. how its process ended, and whether it was given up)."""
    lost = [
        f"worker {w.worker_id} lost" + (f": {w.lost_reason}" if w.lost_reason else "")
        for w in status.workers
        if w.lost
    ]
    if status.failure:
        return status.failure
    if lost:
        return "; ".join(lost)
    if not status.ready or status.workers_registered < status.workers_expected:
        return f"{status.workers_registered} of {status.workers_expected} workers registered"
    return None


class ClosingStream(StreamingResponse):
    """A stream that calls `on_close` once it is over, however it ended: a client that disconnects
    before the body starts leaves a generator that never ran, whose own cleanup never runs."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
