"""A request's output text as its blocks commit: cut at the model's EOS, at `max_tokens` or before a stop
string (matched in time linear in its length), each block's text decoded from its own ids and a few
before them."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from serve.tokenizer import TextTokenizer

CONTEXT_IDS = 4  # settled ids decoded again with new ones: a tokenizer may join a text to the one before


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
