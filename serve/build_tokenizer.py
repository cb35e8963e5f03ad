"""Build the small byte-level BPE that `sangam serve` ships for random weights and the tiny models.

    python -m serve.build_tokenizer          # rewrites serve/data/tokenizer.json and tokenizer_config.json

Its 300 ids fit the tiny models' vocabulary: ids 0..255 are the bytes, 256..297 merges learnt from the
text below, 298 is `<|endoftext|>` (the tiny models' EOS) and 299 `<|mdm_mask|>` (their mask id, which a
prompt may never hold). Byte-level, so any text encodes. Training is deterministic: the same text gives
the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DATA = Path(__file__).resolve().parent / "data"
EOS, MASK = "<|endoftext|>", "<|mdm_mask|>"
EOS_ID, MASK_ID = 298, 299  # executor.model.config.tiny: eos_ids (298,), mask_id 299
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}" + EOS + "\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = """\
A diffusion language model writes a whole block of text at once. It starts from a block of masked
positions and, forward after forward, commits the positions it is most confident about, until every
position of the block holds a token. Then the next block begins. The server keeps the prompt and the
committed blocks; every block starts with a prefill over the whole sequence, and then its decode steps
rewrite only the block itself. The scheduler places each prefill on the worker with the fewest
outstanding tokens, and a worker forms its batch under a token budget every iteration.
The user asks a question, the assistant answers it, and the system sets the tone of the conversation.
What is the weather like today? It is sunny, with a light wind from the west and a few clouds.
Please summarise the following text in three sentences. Here is a short story about a cat and a dog.
The quick brown fox jumps over the lazy dog. Hello, world! Thank you for your help.
"""


def train() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=EOS_ID, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    tokenizer.add_special_tokens([EOS, MASK])
    if (tokenizer.token_to_id(EOS), tokenizer.token_to_id(MASK)) != (EOS_ID, MASK_ID):
        raise RuntimeError(
            f"special tokens landed at {tokenizer.token_to_id(EOS)}, {tokenizer.token_to_id(MASK)}"
        )
    return tokenizer


def main() -> None:
    DATA.mkdir(exist_ok=True)
    train().save(str(DATA / "tokenizer.json"), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "mask_token": MASK,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (DATA / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
