"""Text to token ids and back, and chat messages through the chat template.

Two sources, one interface (`TextTokenizer`):

- the small BPE shipped in `serve/data` (random weights and the tiny models; `serve.build_tokenizer`
  makes it), read with the `tokenizers` library and its Jinja chat template rendered here, so that a
  server starts without transformers' import time;
- a Hugging Face checkpoint directory (`--weights DIR`, or `--tokenizer DIR`), read with transformers'
  `AutoTokenizer`, which applies the checkpoint's own chat template. A tokenizer that is code shipped with
  the checkpoint (Dream's `tokenization_dream.py`, named by tokenizer_config.json's `auto_map`) runs only
  with `--trust-remote-code`; without it the server ends with one line saying so. `trust_remote_code` is
  always passed, so transformers never asks on a terminal (it would for any `auto_map`, LLaDA's config's
  included, whose tokenizer needs no code).

Both let go of the GIL while they encode (the `tokenizers` library's batch call, which transformers' fast
tokenizers make for one text too), so that the app tokenizes a long prompt on a thread while its event
loop runs.

The model decides when a request ends (its EOS ids, from the workers' registration: the worker flags a
block that commits one); `eos_mismatch` warns of a tokenizer whose EOS is not among them. Decoding leaves
out every special token (the turn ends, the mask, ...), whatever the tokenizer's own rules.
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

    def is_special(self, token: int) -> bool:
        """Whether `decode` leaves the token out: a special token, or an id the tokenizer does not know."""

    def token_text(self, token: int) -> str:
        """One token's text on its own (what log-probs name it by, as vLLM does; part of a character's
        bytes is U+FFFD), a special token's own name (`<|endoftext|>`), "" for an unknown id."""

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
        added = self._tokenizer.get_added_tokens_decoder()
        self._special = frozenset(token for token, entry in added.items() if entry.special)
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

    def is_special(self, token: int) -> bool:
        return token in self._special or self._tokenizer.id_to_token(token) is None

    def token_text(self, token: int) -> str:
        if self.is_special(token):
            return self._tokenizer.id_to_token(token) or ""
        return self.decode([token])

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        text = self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True
        )
        return self.encode(text)


class PretrainedTokenizer:
    """A checkpoint's tokenizer through transformers' `AutoTokenizer` (offline: a local directory); its
    own code runs only with `trust_remote_code`."""

    def __init__(self, directory: Path, *, trust_remote_code: bool = False) -> None:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        self.name = str(directory)
        code = remote_code(directory)
        if code is not None and not trust_remote_code:
            raise ValueError(
                f"{directory}: the tokenizer is code shipped with the checkpoint ({code}); "
                "pass --trust-remote-code to run it"
            )
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # not its notes on the checkpoint's model type, which we never load
        try:
            self._tokenizer: Any = AutoTokenizer.from_pretrained(
                str(directory), local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, ImportError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if "trust_remote_code" in str(err):
                first = "the checkpoint's own code is needed to load it; pass --trust-remote-code to run it"
            raise ValueError(f"{directory}: cannot load a tokenizer: {first}") from None
        finally:
            hf_logging.set_verbosity(verbosity)
        self.eos_id = self._tokenizer.eos_token_id
        vocab = self._tokenizer.get_vocab()
        self.longest_token = max(map(len, vocab))
        special = set(self._tokenizer.all_special_ids) | {
            token for token, added in self._tokenizer.added_tokens_decoder.items() if added.special
        }
        # what decode keeps: a model's vocabulary may be larger than its tokenizer's (Dream's 152,064 rows
        # against 151,667 tokens), and a slow tokenizer may fail on an id it does not know
        self._text_ids = frozenset(vocab.values()) - special
        self._names = {token: name for name, token in vocab.items()}
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(f"--tokenizer {directory}: the tokenizer has no chat template")

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        kept = [token for token in ids if token in self._text_ids]
        text: str = self._tokenizer.decode(kept, skip_special_tokens=True)
        return text

    def is_special(self, token: int) -> bool:
        return token not in self._text_ids

    def token_text(self, token: int) -> str:
        return self._names.get(token, "") if self.is_special(token) else self.decode([token])

    def chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        text = self._tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True,
            tokenize=False,
        )  # fmt: skip
        return self.encode(text)


def load_tokenizer(tokenizer: Path | None, weights: str, *, trust_remote_code: bool = False) -> TextTokenizer:
    """`--tokenizer DIR` if given, else the `--weights DIR` checkpoint's, else the built-in BPE."""
    directory = tokenizer if tokenizer is not None else (None if weights == "random" else Path(weights))
    if directory is None:
        return BuiltinTokenizer()
    if not directory.is_dir():
        raise ValueError(f"--tokenizer {directory}: not a directory")
    return PretrainedTokenizer(directory, trust_remote_code=trust_remote_code)


def remote_code(directory: Path) -> str | None:
    """The module of the checkpoint that its tokenizer is (tokenizer_config.json's `auto_map` names it for
    AutoTokenizer: Dream's `tokenization_dream.py`), or None: a tokenizer transformers implements."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    entry = (config.get("auto_map") or {}).get("AutoTokenizer") if isinstance(config, dict) else None
    names = [entry] if isinstance(entry, str) else [n for n in entry or () if isinstance(n, str)]
    if not names:
        return None
    module = names[0].split("--")[-1].rsplit(".", 1)[0]  # "repo--module.Class" names another repository's
    return f"{module}.py"


def eos_mismatch(tokenizer: TextTokenizer, eos_ids: Sequence[int]) -> str | None:
    """A warning if the model would not stop at the tokenizer's EOS (the end of a chat turn), else None.
    (The built-in BPE's EOS is the tiny models' by construction; random full-size weights have another.)"""
    if tokenizer.eos_id is None or tokenizer.eos_id in eos_ids:
        return None
    return (
        f"the tokenizer's EOS id {tokenizer.eos_id} ({tokenizer.name}) is not one of the model's EOS ids "
        f"{list(eos_ids)}: requests stop at the model's EOS or at max_tokens"
    )
