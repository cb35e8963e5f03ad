"""The built-in BPE and the checkpoint path (transformers' AutoTokenizer) agree, and the shipped file is
what `serve.build_tokenizer` makes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from serve import build_tokenizer
from serve.tokenizer import (
    BUILTIN,
    BuiltinTokenizer,
    Message,
    PretrainedTokenizer,
    eos_mismatch,
    load_tokenizer,
)

TEXT = "Hello, world! A diffusion model writes a block at once: héllo 日本 ✓"
CHAT = [
    Message("system", "Be brief."),
    Message("user", "What is a block?"),
    Message("assistant", "32 tokens."),
]


def test_the_shipped_tokenizer_is_what_the_build_script_trains() -> None:
    shipped = Tokenizer.from_file(str(BUILTIN / "tokenizer.json"))
    assert build_tokenizer.train().to_str() == shipped.to_str()
    assert shipped.get_vocab_size() == 300  # the tiny models' vocabulary
    assert (shipped.token_to_id(build_tokenizer.EOS), shipped.token_to_id(build_tokenizer.MASK)) == (298, 299)


def test_autotokenizer_reads_the_same_ids_text_and_chat_template() -> None:
    builtin, pretrained = BuiltinTokenizer(), PretrainedTokenizer(BUILTIN)
    ids = builtin.encode(TEXT)
    assert pretrained.encode(TEXT) == ids and builtin.decode(ids) == pretrained.decode(ids) == TEXT
    assert builtin.chat_prompt(CHAT) == pretrained.chat_prompt(CHAT)
    assert builtin.decode(builtin.chat_prompt(CHAT)).endswith("<|assistant|>\n")
    assert builtin.eos_id == pretrained.eos_id == 298
    assert builtin.decode([*ids, 298, 299]) == TEXT  # special tokens are left out of the text


def test_both_name_each_token_alike_for_its_logprobs() -> None:
    builtin, pretrained = BuiltinTokenizer(), PretrainedTokenizer(BUILTIN)
    every = range(310)  # the vocabulary, and ids beyond it
    assert [pretrained.token_text(t) for t in every] == [builtin.token_text(t) for t in every]
    assert [pretrained.is_special(t) for t in every] == [builtin.is_special(t) for t in every]
    assert [t for t in every if builtin.is_special(t)] == [298, 299, *range(300, 310)]
    assert pretrained.token_text(298) == "<|endoftext|>" and pretrained.token_text(305) == ""


def test_which_tokenizer_loads_and_bad_directories(tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(None, "random"), BuiltinTokenizer)
    with pytest.raises(ValueError, match="not a directory"):
        load_tokenizer(tmp_path / "nothing", "random")
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        load_tokenizer(None, str(tmp_path))  # a --weights directory without a tokenizer
    assert eos_mismatch(BuiltinTokenizer(), (298,)) is None
    warning = eos_mismatch(BuiltinTokenizer(), (126081, 126348))
    assert warning is not None and "298" in warning and "\n" not in warning
