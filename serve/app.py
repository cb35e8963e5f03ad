"""The OpenAI-compatible HTTP API (FastAPI): `/v1/models`, `/v1/completions`, `/v1/chat/completions`,
`/health` and `/metrics`, over any `Backend` (the running scheduler, or a fake in tests).

A request's life here: the API key (401), the server's state (503 while starting, draining or failed),
the waiting line (429 with Retry-After beyond `max_waiting`), the body and the prompt against the
model's limits (400: every refusal the scheduler's admission would make, made before it is asked),
then Submit and the request's block updates. `max_tokens` becomes whole 32-token blocks (at most the mask
buffer) and the text is cut at `max_tokens` or at the model's EOS. A stream sends one SSE chunk per
committed block, then the usage chunk if asked, then `data: [DONE]`. A client that goes away (a closed
stream or connection) cancels its request at the scheduler. `/health` and `/metrics` need no API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from executor.control.client import SangamError
from executor.control.messages import ClusterStatus, RequestState, Sampling, Submission, WorkerState
from sangam.hardware import BLOCK, pages_for
from serve import protocol as api
from serve.backend import Backend, Limits, ServingState
from serve.metrics import CONTENT_TYPE, Metrics
from serve.tokenizer import Message, TextTokenizer

RETRY_AFTER_S = 1
CONTEXT_IDS = 4  # settled ids decoded again with new ones: a tokenizer may join a text to the one before
REQUEST_ID_HEADER = "x-sangam-request-id"
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """A request refused or failed: OpenAI's error JSON with this status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def response(self) -> JSONResponse:
        body = api.ErrorResponse(
            error=api.ErrorBody(message=self.message, type=ERROR_TYPES[self.status], param=self.param,
                                code=self.status)
        )  # fmt: skip
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else None
        return JSONResponse(body.model_dump(), status_code=self.status, headers=headers)


@dataclass(frozen=True, slots=True)
class AppConfig:
    model: str  # the served model's name
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on /v1/*
    max_waiting: int = 256  # queued requests beyond which new ones get 429


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
        return max(
            (n for stop in self.stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0
        )


def create_app(backend: Backend, tokenizer: TextTokenizer, state: ServingState, config: AppConfig) -> FastAPI:
    """The HTTP app over `backend`; `state` is shared with whoever starts and drains the cluster."""
    app = FastAPI(title="Sangam", docs_url=None, redoc_url=None)
    metrics = Metrics(config.model)
    background: set[asyncio.Task[None]] = set()

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    if config.api_key is not None:
        app.add_middleware(RequireKey, key=config.api_key)

    @app.get("/health")
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
        card = api.ModelCard(id=limits.model, created=int(time.time()), max_model_len=limits.context_len)
        return api.ModelList(data=[card])

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        started = time.monotonic()
        limits = ready()
        body = await parsed(request, api.CompletionRequest)
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        check_text_length(sum(len(t) for t in texts if isinstance(t, str)), tokenizer, limits)
        prompt = completion_prompt(body.prompt, tokenizer)
        job = await admit(body, prompt, limits, started)
        name, created, rid = body.model or limits.model, int(time.time()), f"cmpl-{uuid.uuid4().hex}"
        output = Output(tokenizer, () if body.ignore_eos else limits.eos_ids, job.max_tokens, body.stops)
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(prompt)

        def chunk(text: str, finish: str | None) -> api.CompletionChunk:
            nonlocal echo
            choice = api.CompletionChoice(text=echo + text, finish_reason=finish)
            echo = ""  # the prompt goes with the first chunk
            return api.CompletionChunk(id=rid, created=created, model=name, choices=[choice])

        if body.stream:
            return sse(
                job, output, chunk, body.include_usage, rid, created, name, request, api.CompletionChunk
            )
        await until_done(job, output, request)
        choice = api.CompletionChoice(text=echo + output.sent, finish_reason=output.finish)
        return json_response(
            api.CompletionResponse(
                id=rid, created=created, model=name, choices=[choice], usage=usage(job, output)
            ),
            job.headers,
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        started = time.monotonic()
        limits = ready()
        body = await parsed(request, api.ChatRequest)
        if not body.messages:
            raise APIError(400, "messages: at least one message is required", "messages")
        for i, message in enumerate(body.messages):
            if message.role not in api.ROLES:
                raise APIError(400, f"messages.{i}.role: unknown role {message.role!r} "
                               f"(known: {', '.join(api.ROLES)})", f"messages.{i}.role")  # fmt: skip
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        check_text_length(sum(len(m.text) for m in body.messages), tokenizer, limits)
        prompt = tokenizer.chat_prompt([Message(m.role, m.text) for m in body.messages])
        job = await admit(body, prompt, limits, started)
        name, created, rid = body.model or limits.model, int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
        output = Output(tokenizer, () if body.ignore_eos else limits.eos_ids, job.max_tokens, body.stops)
        first = True

        def chunk(text: str, finish: str | None) -> api.ChatChunk:
            nonlocal first
            delta = api.Delta(role="assistant" if first else None, content=text)
            first = False
            choice = api.ChatChunkChoice(delta=delta, finish_reason=finish)
            return api.ChatChunk(id=rid, created=created, model=name, choices=[choice])

        if body.stream:
            return sse(job, output, chunk, body.include_usage, rid, created, name, request, api.ChatChunk)
        await until_done(job, output, request)
        choice = api.ChatChoice(
            message=api.AssistantMessage(content=output.sent), finish_reason=output.finish
        )
        return json_response(
            api.ChatResponse(id=rid, created=created, model=name, choices=[choice], usage=usage(job, output)),
            job.headers,
        )

    # ---- admission ------------------------------------------------------------------------------------

    def ready() -> Limits:
        reason = state.unavailable()
        if reason is not None:
            raise APIError(503, reason)
        assert state.limits is not None
        return state.limits

    async def admit(body: api.Sampling, prompt: list[int], limits: Limits, started: float) -> Job:
        """Check the request, then Submit it; APIError for every refusal."""
        max_tokens = check_request(body, prompt, limits)
        if state.waiting >= config.max_waiting:
            raise APIError(
                429, f"{state.waiting} requests are waiting already (--max-waiting {config.max_waiting})"
            )
        n_blocks = -(-max_tokens // BLOCK)
        forwards = (body.forwards_per_block,) * n_blocks if body.forwards_per_block is not None else ()
        sampling = Sampling(body.threshold, body.temperature, body.seed)
        state.admitting += 1
        try:
            result = await backend.submit(Submission(tuple(prompt), BLOCK * n_blocks, sampling, forwards))
        except SangamError as err:
            raise scheduler_error(err) from None
        finally:
            state.admitting -= 1
        if result.status == "ERROR":  # the scheduler's admission: a check the HTTP layer does not make
            raise APIError(400, result.error)
        state.requests[result.request_id] = result.status
        return Job(result.request_id, len(prompt), max_tokens, started)

    # ---- running --------------------------------------------------------------------------------------

    async def blocks(job: Job, output: Output) -> AsyncIterator[str]:
        """The text each committed block adds, until the output is final; the request's metrics once
        it ends, and a cancel at the scheduler if the caller stops listening before that."""
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
                        yield output.add_block(
                            update.token_ids[BLOCK * consumed : BLOCK * (consumed + 1)], final
                        )
                        consumed += 1
                    if output.finish is not None:
                        reason = output.finish
                        return
                    if update.status == "ERROR":
                        reason = "error"
                        raise APIError(500, f"the request failed: {update.error}")
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
            later(backend.cancel(job.request_id))
        metrics.finished(
            last, time.monotonic() - job.started, reason, job.prompt_tokens, output.completion_tokens
        )

    async def until_done(job: Job, output: Output, request: Request) -> None:
        """Run the request to its end, or cancel it if the client disconnects first."""

        async def consume() -> None:
            async for _ in blocks(job, output):
                pass

        run = asyncio.ensure_future(consume())
        gone = asyncio.ensure_future(disconnected(request))
        await asyncio.wait((run, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not run.done():
            run.cancel()
            end(job, output, None, "abort")  # also if the task was cancelled before it started
            raise APIError(400, "the client disconnected")
        run.result()

    def sse(
        job: Job, output: Output, chunk: Callable[[str, str | None], Any], include_usage: bool,
        rid: str, created: int, name: str, request: Request, kind: type[api.ChatChunk | api.CompletionChunk],
    ) -> StreamingResponse:  # fmt: skip
        async def events() -> AsyncIterator[str]:
            last_write = ""  # the last block's chunk, the usage chunk and [DONE] go out in one write
            try:
                async for text in blocks(job, output):
                    event = event_of(chunk(text, output.finish).model_dump_json(exclude={"usage"}))
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

    def later(coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` to its end even if the task that started it is being cancelled."""

        async def quietly() -> None:
            with contextlib.suppress(SangamError):  # the scheduler is gone: so is the request
                await coro

        task = asyncio.get_running_loop().create_task(quietly())
        background.add(task)
        task.add_done_callback(background.discard)

    return app


def check_request(body: api.Sampling, prompt: Sequence[int], limits: Limits) -> int:
    """The request's max_tokens, after every check the scheduler's admission makes and of the fields
    Sangam does not implement; APIError(400) else."""
    unsupported = body.unsupported()
    if unsupported is not None:
        raise APIError(400, f"{unsupported}: not supported by Sangam", unsupported)
    if not all(body.stops):
        raise APIError(400, "stop: a stop string is empty", "stop")
    if body.n != 1:
        raise APIError(400, f"n: only n=1 is supported, got {body.n}", "n")
    max_tokens = limits.mask_len if body.max_tokens is None else body.max_tokens
    if not 0 < max_tokens <= limits.mask_len:
        raise APIError(
            400,
            f"max_tokens: must lie in [1, {limits.mask_len}] (the mask buffer), got {max_tokens}",
            "max_tokens",
        )
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    if min(prompt) < 0 or max(prompt) >= limits.vocab or limits.mask_id in prompt:  # scans in C
        bad = next(i for i, t in enumerate(prompt) if not 0 <= t < limits.vocab or t == limits.mask_id)
        token = prompt[bad]
        what = (
            "is the mask id" if token == limits.mask_id else f"is outside the vocabulary [0, {limits.vocab})"
        )
        raise APIError(400, f"prompt token {token} at position {bad} {what}", "prompt")
    if len(prompt) + limits.mask_len > limits.context_len:
        raise APIError(
            400, f"the prompt is too long: {len(prompt)} tokens plus the {limits.mask_len}-token mask buffer "
            f"exceed the model's context window of {limits.context_len} tokens", "prompt",
        )  # fmt: skip
    if pages_for(len(prompt) + limits.mask_len) > limits.pages:
        raise APIError(
            400, f"the prompt is too long for a worker's KV pool: {len(prompt)} tokens plus the "
            f"{limits.mask_len}-token mask buffer need {pages_for(len(prompt) + limits.mask_len)} pages, a "
            f"worker holds {limits.pages}", "prompt",
        )  # fmt: skip
    return max_tokens


TEXT_SLACK = 2  # a normaliser may shrink a text before it is tokenized (composed characters)


def check_text_length(chars: int, tokenizer: TextTokenizer, limits: Limits) -> None:
    """Refuse a prompt of more characters than its room in the context window can hold at the longest
    token's length, before it is tokenized: tokenizing holds the event loop (and the GIL, so a thread does
    not help; a 4 MB prompt held every other request for 6 s)."""
    room = limits.context_len - limits.mask_len
    if chars > TEXT_SLACK * tokenizer.longest_token * room:
        raise APIError(
            400, f"the prompt is too long: {chars} characters cannot fit in the {room} tokens the model's "
            f"context window leaves beside the {limits.mask_len}-token mask buffer", "prompt",
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


async def parsed(request: Request, model: type[M]) -> M:
    """The request's JSON body as `model` (parsed and validated by pydantic in one pass, without FastAPI's
    body machinery, which took most of a millisecond); APIError(400) naming the first bad field. A body
    sent as another media type is refused (415), as FastAPI does: a web page may send any site a form
    or text body without asking first, but not a JSON one."""
    kind = request.headers.get("content-type")
    if kind is not None:
        media = kind.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise APIError(415, f"the body must be JSON (Content-Type: application/json), not {media}")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        errors = err.errors(include_url=False)
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        raise APIError(400, message, where or None) from None


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
    """Why the cluster is not healthy (`/health` 503), or None: every worker registered and not lost."""
    lost = [str(w.worker_id) for w in status.workers if w.lost]
    if status.failure:
        return status.failure
    if lost:
        return f"worker{'s' if len(lost) > 1 else ''} {', '.join(lost)} lost"
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
