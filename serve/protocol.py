"""Request and response bodies of the HTTP API, in OpenAI's shapes (as vLLM serves them).

Every field a request carries is acted on or refused: `stop` cuts the text at the first stop string,
`echo` (completions) puts the prompt's text before it, `logprobs` (and chat's `top_logprobs`) add each
output token's log-probability (`serve.logprobs`). Any other field (OpenAI's `best_of`, `top_p`,
`tools`, ... or an unknown one) is a 400 naming it (`unsupported`), unless it is null or its neutral
value (`top_p: 1`, ...: what some clients always send) or one of OpenAI's fields that only label a
request (`user`, `metadata`, ...). The dLLM's own knobs are extra fields of both requests:

- `threshold`: the confidence threshold of unmasking, in (0, 1] (the server's default: 0.9);
- `forwards_per_block`: force every 32-token block to take exactly this many forwards (1..32),
  instead of the sampler deciding; the request then runs all its blocks (the text is still cut at EOS);
- `ignore_eos` (vLLM's): the text is not cut at EOS (with `forwards_per_block`, the request then runs
  exactly `max_tokens` tokens, as benchmarks want; without it the scheduler still ends the request after
  the block that commits EOS).

The request models are strict, as OpenAI is: no value is coerced to a field's type (`temperature: false`,
`max_tokens: "1"` or `true`, `stream: "yes"` and `prompt: [true]` are 400s; an integer is a number).
A neutral value is one of the same type (`top_p: true` is not `1`); chat's `logprobs` is a boolean and a
completion's an integer (`logprobs: 0` asks for the chosen tokens' log-probs alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ROLES = ("system", "developer", "user", "assistant")
TOOL_ROLES = ("tool", "function")  # OpenAI's roles of tool calling, which Sangam does not implement
INT64 = 1 << 63
LABELS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
NEUTRAL: dict[str, tuple[Any, ...]] = {  # values of fields Sangam does not implement that change nothing
    "best_of": (1,),
    "top_logprobs": (0,),
    "top_p": (1,),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logit_bias": ({},),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True, False),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
}


STRICT = ConfigDict(strict=True, extra="allow")  # extra fields kept, so that they can be named


class NullIsDefault(BaseModel):
    """A field given as null takes its default, as OpenAI's nullable fields do (`n: null`, `stream: null`)."""

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if value is not None or key not in cls.model_fields}


def same(value: Any, neutral: Any) -> bool:
    """`value` is `neutral`, of the same JSON type (`0 == False` in Python, not in JSON)."""
    return isinstance(value, bool) == isinstance(neutral, bool) and bool(value == neutral)


class StreamOptions(NullIsDefault):
    model_config = STRICT
    neutral: ClassVar[Mapping[str, tuple[Any, ...]]] = {"include_obfuscation": (False,)}  # OpenAI's padding

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries the usage so far

    def extra(self) -> list[tuple[str, Any]]:
        """The options given that are not fields (`Sampling.unsupported` names them)."""
        return list((self.model_extra or {}).items())


class Sampling(NullIsDefault):
    """The fields both endpoints share."""

    model_config = STRICT
    neutral: ClassVar[Mapping[str, tuple[Any, ...]]] = NEUTRAL

    model: str | None = None
    max_tokens: int | None = None  # default: the whole mask buffer
    temperature: float | None = Field(None, ge=0.0)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    threshold: float | None = Field(None, gt=0.0, le=1.0)
    forwards_per_block: int | None = Field(None, ge=1, le=32)
    ignore_eos: bool = False  # vLLM's: the text runs to max_tokens through any EOS (benchmarks)
    stop: str | list[str] | None = None  # the text ends before the first of these strings

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM's `continuous_usage_stats`, which needs `include_usage` as there)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def unsupported(self) -> str | None:
        """The first field given that Sangam would have to ignore (see the module's docstring), or None;
        one of `stream_options` as `stream_options.<name>`."""
        given = [("", key, value, self.neutral) for key, value in (self.model_extra or {}).items()]
        if (options := self.stream_options) is not None:
            given += [("stream_options.", key, value, options.neutral) for key, value in options.extra()]
        for prefix, key, value, neutral_values in given:
            if value is None or (not prefix and key in LABELS):
                continue
            if not any(same(value, neutral) for neutral in neutral_values.get(key, ())):
                return prefix + key
        return None


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # the prompt's text before the generated text
    logprobs: int | None = None  # each output token's log-prob and its position's `logprobs` likeliest


class ContentPart(BaseModel):
    model_config = STRICT

    type: str  # "text" alone is served: the app names any other
    text: str | None = None


class ChatMessage(BaseModel):
    """A message as sent: what Sangam cannot serve (a tool's message, null content, tool calls, an image)
    is named by the app (`serve.checks.check_messages`), not by a parse error of a union."""

    model_config = STRICT

    role: str
    content: str | list[ContentPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens
    logprobs: bool = False  # each output token's log-prob
    top_logprobs: int | None = None  # and its position's `top_logprobs` likeliest (needs logprobs)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape: per output token its text, log-prob, likeliest tokens (the chosen one among
    them) and the offset of its text (`serve.logprobs`)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None  # the UTF-8 bytes of `token`


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sangam"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str  # the HTTP status, as vLLM, or OpenAI's name of the error (`model_not_found`)


class ErrorResponse(BaseModel):
    error: ErrorBody
