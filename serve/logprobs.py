"""Log-probs of a request's output tokens in OpenAI's shapes, a block at a time.

Each token's log-prob is the one the scheduler's states carry (`executor.control.messages.Logprobs`: from
the forward that committed it, under that forward's raw logits), and its alternatives are that forward's
likeliest tokens at its position. The tokens are those of the output's text (`serve.output.Output.ids`: up to
max_tokens, the EOS or the token that completed a stop string); a special token, which the text never
shows, has no entry. A token is named by its text on its own, as vLLM does (`TextTokenizer.token_text`),
and a completion's `text_offset` adds up those texts' lengths from the first generated token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from executor.control.messages import Logprobs
from serve import protocol as api
from serve.tokenizer import TextTokenizer


@dataclass(frozen=True, slots=True)
class Entry:
    """One output token's log-prob and its alternatives', by their texts."""

    text: str
    logprob: float
    top: list[tuple[str, float]]


class OutputLogprobs:
    """The entries of an output's tokens not given yet: each call gives those of the tokens added since."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.given = 0  # output tokens whose entries went out
        self.offset = 0  # characters of their texts

    def chat(self, ids: Sequence[int], logprobs: Logprobs) -> api.ChatLogprobs:
        """The new tokens of `ids` (the output's so far; `logprobs`: at least theirs) in chat's shape."""
        content = [
            api.TokenLogprob(
                token=e.text, logprob=e.logprob, bytes=utf8(e.text),
                top_logprobs=[api.TopLogprob(token=t, logprob=lp, bytes=utf8(t)) for t, lp in e.top],
            )
            for e in self._entries(ids, logprobs)
        ]  # fmt: skip
        return api.ChatLogprobs(content=content)

    def completion(self, ids: Sequence[int], logprobs: Logprobs) -> api.CompletionLogprobs:
        """The new tokens of `ids` in the completions' shape: each token's likeliest with itself among
        them (OpenAI's "up to logprobs + 1"), and its text's offset."""
        entries = self._entries(ids, logprobs)
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            self.offset += len(entry.text)
        return api.CompletionLogprobs(
            tokens=[e.text for e in entries],
            token_logprobs=[e.logprob for e in entries],
            top_logprobs=[dict(e.top) | {e.text: e.logprob} for e in entries],
            text_offset=offsets,
        )

    def _entries(self, ids: Sequence[int], logprobs: Logprobs) -> list[Entry]:
        text = self.tokenizer.token_text
        entries = [
            Entry(text(ids[i]), logprobs.token[i], [(text(t), lp) for t, lp in logprobs.alternatives(i)])
            for i in range(self.given, len(ids))
            if not self.tokenizer.is_special(ids[i])
        ]
        self.given = len(ids)
        return entries


def utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))
