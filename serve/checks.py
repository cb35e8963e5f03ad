"""What a request may hold, checked before the scheduler is asked, so that no request holds the event loop
for long whatever it carries: its body is refused beyond the size the longest prompt the model takes could
need (413) and, before it is parsed, beyond the JSON strings and values a request can use (400, counted at
memory speed: pydantic's parse of 170,000 empty messages held the loop for a second); every field that is
a list has a bound (below); and its fields are checked against the model's limits as the scheduler's
admission would (400 naming the field)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from executor.control.messages import MAX_TOP_LOGPROBS
from sangam.hardware import BLOCK, pages_for
from serve import protocol as api
from serve.backend import Limits
from serve.errors import APIError
from serve.tokenizer import TextTokenizer

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
