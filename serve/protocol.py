"""Request and response bodies of the HTTP API, in OpenAI's shapes (as vLLM serves them).

Every field a request carries is acted on or refused: `stop` cuts the text at the first stop string,
`echo` (completions) puts the prompt's text before it. Any other field (OpenAI's `logprobs`,
`best_of`, `top_p`, `tools`, ... or an unknown one) is a 400 naming it (`unsupported`), unless it is
null or its neutral value (`top_p: 1`, `logprobs: false`, ...: what some clients always send) or one of
OpenAI's fields that only label a request (`user`, `metadata`, ...). The dLLM's own knobs are extra
fields of both requests:

- `threshold`: the confidence threshold of unmasking, in (0, 1] (the server's default: 0.9);
- `forwards_per_block`: force every 32-token block to take exactly this many forwards (1..32),
  instead of the sampler deciding; the request then runs all its blocks (the text is still cut at EOS);
- `ignore_eos` (vLLM's): the text is not cut at EOS (with `forwards_per_block`, the request then runs
  exactly `max_tokens` tokens, as benchmarks want; without it the scheduler still ends the request after
  the block that commits EOS).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ROLES = ("system", "developer", "user", "assistant")
INT64 = 1 << 63
LABELS = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
NEUTRAL: dict[str, tuple[Any, ...]] = {  # values of fields Sangam does not implement that change nothing
    "best_of": (1,),
    "logprobs": (False, 0),
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


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")  # kept, so that `unsupported` can name them

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
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def unsupported(self) -> str | None:
        """The first field given that Sangam would have to ignore (see the module's docstring), or None."""
        for name, value in (self.model_extra or {}).items():
            if value is not None and name not in LABELS and value not in NEUTRAL.get(name, ()):
                return name
        return None


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # the prompt's text before the generated text


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: str
    content: str | list[ContentPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
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


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
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
    logprobs: None = None
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
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody
