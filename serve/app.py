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

No request holds the event loop for long, whatever it carries: its body and fields are bounded before
it is parsed (`serve.checks`), its output's stop strings are matched in linear time (`serve.output`), and
a long prompt is tokenized on a thread, by a tokenizer that lets go of the GIL meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from executor.control.client import SangamError
from executor.control.messages import (
    ClusterStatus,
    Logprobs,
    RequestState,
    Sampling,
    Submission,
    WorkerState,
)
from sangam.hardware import BLOCK
from sangam.request import response_region
from serve import protocol as api
from serve.backend import Backend, Limits, ServingState, ShutDown
from serve.checks import (
    check_chat_logprobs,
    check_completion_logprobs,
    check_fields,
    check_messages,
    check_prompt,
    check_text_length,
    parsed,
)
from serve.errors import APIError
from serve.logprobs import OutputLogprobs
from serve.metrics import CONTENT_TYPE, Metrics
from serve.output import Output
from serve.tokenizer import Message, TextTokenizer

REQUEST_ID_HEADER = "x-sangam-request-id"
INLINE_CHARS = 2048  # a prompt of fewer characters is tokenized on the event loop (a thread costs more)


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


def asked(logprobs: Logprobs | None) -> Logprobs:
    """The log-probs a request asked for, which the scheduler's states carry from its first block on."""
    if logprobs is None:
        raise APIError(500, "the scheduler sent no log-probs for a request that asked for them")
    return logprobs


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
