"""A stand-in, written for Sangam's tests and benchmarks, for the `tokenization_dream.py` that Dream's
repository ships: a byte-level BPE read from `vocab.json` and `merges.txt`, the added tokens from
`added_tokens.json` and tokenizer_config.json. Loading it takes `trust_remote_code=True`, as the real one
does; it is not Dream's code and shares none of it (no pre-tokenization regex: a text is one word).
"""

from __future__ import annotations

import json
import os
from itertools import pairwise
from typing import ClassVar

from transformers import PreTrainedTokenizer


def byte_alphabet() -> dict[int, str]:
    """A printable character for each byte: printable Latin-1 bytes stand for themselves, the others
    (controls, space, ...) take the characters from U+0100 on, in byte order."""
    shown = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    alphabet, spare = {}, 0x100
    for byte in range(256):
        if byte in shown:
            alphabet[byte] = chr(byte)
        else:
            alphabet[byte] = chr(spare)
            spare += 1
    return alphabet


class DreamTokenizer(PreTrainedTokenizer):
    vocab_files_names: ClassVar[dict[str, str]] = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, merges_file: str, **kwargs: object) -> None:
        with open(vocab_file, encoding="utf-8") as f:
            self.encoder: dict[str, int] = json.load(f)
        self.decoder = {index: piece for piece, index in self.encoder.items()}
        with open(merges_file, encoding="utf-8") as f:
            pairs = [tuple(line.split()) for line in f.read().splitlines()[1:] if line.strip()]
        self.ranks = {pair: rank for rank, pair in enumerate(pairs)}
        self.to_char = byte_alphabet()
        self.to_byte = {char: byte for byte, char in self.to_char.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        return {**self.encoder, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs: object) -> list[str]:
        pieces = [self.to_char[b] for b in text.encode("utf-8")]
        while len(pieces) > 1:
            ranked = [
                (self.ranks.get((a, b), len(self.ranks)), i) for i, (a, b) in enumerate(pairwise(pieces))
            ]
            rank, at = min(ranked)
            if rank == len(self.ranks):
                break
            pieces[at : at + 2] = [pieces[at] + pieces[at + 1]]
        return pieces

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytes(self.to_byte[c] for c in "".join(tokens))
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, str]:
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab = os.path.join(save_directory, prefix + "vocab.json")
        merges = os.path.join(save_directory, prefix + "merges.txt")
        with open(vocab, "w", encoding="utf-8") as f:
            json.dump(self.encoder, f, ensure_ascii=False)
        with open(merges, "w", encoding="utf-8") as f:
            f.write(
                "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in sorted(self.ranks, key=self.ranks.get))
            )
        return vocab, merges
