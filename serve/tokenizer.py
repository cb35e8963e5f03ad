"""Text to token ids and back, and chat messages through the chat template.

Two sources, one interface (`TextTokenizer`):

- the small BPE shipped in `serve/data` (random weights and the tiny models; `serve.build_tokenizer`
  makes it), read with the `tokenizers` library and its Jinja chat template rendered here, so that a
  server starts without transformers' import time;
- a Hugging Face checkpoint directory (`--weights DIR`, or `--tokenizer DIR`), read with transformers'
  `AutoTokenizer`, which applies the checkpoint's own chat template.

Both let go of the GIL while they encode (the `tokenizers` library's batch call, which transformers' fast
tokenizers make for one text too), so that the app tokenizes a long prompt on a thread while its event
loop runs.

The model decides when a request ends (its EOS ids, from the workers' registration: the worker flags a
block that commits one); `eos_mismatch` warns of a tokenizer whose EOS is not among them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

BUILTIN = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


class TextTokenizer(Protocol):
    """What the HTTP layer needs of a tokenizer."""

    name: str  # where it came from, for logs
    eos_id: int | None
    longest_token: int  # characters of the longest entry of the vocabulary, added tokens included

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no special tokens added."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens left out (ids it does not know are left out too)."""

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of `messages` through the chat template, ending with the assistant's turn."""


class BuiltinTokenizer:
    """The shipped BPE (`tokenizer.json`) and the chat template of its `tokenizer_config.json`."""

    def __init__(self, directory: Path = BUILTIN) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self.name = "built-in BPE" if directory == BUILTIN else str(directory)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "tokenizer_config.json").read_text())
        self.eos_id = self._tokenizer.token_to_id(config["eos_token"])
        self.longest_token = max(map(len, self._tokenizer.get_vocab()))
        env = ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=False)
        self._template = env.from_string(config["chat_template"])

    def encode(self, text: str) -> list[int]:
        # encode_batch lets go of the GIL while it runs (encode holds it: a 100,000-character prompt
        # held every other thread for 0.2 s), so that the app's event loop runs while a thread tokenizes
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        ids: list[int] = encoding.ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        text = self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True
        )
        return self.encode(text)


class PretrainedTokenizer:
    """A checkpoint's tokenizer through transformers' `AutoTokenizer` (offline: a local directory)."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self.name = str(directory)
        try:
            self._tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"--tokenizer {directory}: cannot load a tokenizer: {err}") from None
        self.eos_id = self._tokenizer.eos_token_id
        self.longest_token = max(map(len, self._tokenizer.get_vocab()))
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(f"--tokenizer {directory}: the tokenizer has no chat template")

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        text = self._tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True,
            tokenize=False,
        )  # fmt: skip
        return self.encode(text)


def load_tokenizer(tokenizer: Path | None, weights: str) -> TextTokenizer:
    """`--tokenizer DIR` if given, else the `--weights DIR` checkpoint's, else the built-in BPE."""
    directory = tokenizer if tokenizer is not None else (None if weights == "random" else Path(weights))
    if directory is None:
        return BuiltinTokenizer()
    if not directory.is_dir():
        raise ValueError(f"--tokenizer {directory}: not a directory")
    return PretrainedTokenizer(directory)


def eos_mismatch(tokenizer: TextTokenizer, eos_ids: Sequence[int]) -> str | None:
    """A warning if the model would not stop at the tokenizer's EOS (the end of a chat turn), else None.
    (The built-in BPE's EOS is the tiny models' by construction; random full-size weights have another.)"""
    if tokenizer.eos_id is None or tokenizer.eos_id in eos_ids:
        return None
    return (
        f"the tokenizer's EOS id {tokenizer.eos_id} ({tokenizer.name}) is not one of the model's EOS ids "
        f"{list(eos_ids)}: requests stop at the model's EOS or at max_tokens"
    )
