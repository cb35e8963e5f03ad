"""Tiny checkpoints laid out file for file as the two Hugging Face repositories are, written in a test's
tmp_path (nothing binary is committed): GSAI-ML/LLaDA-8B-Instruct and Dream-org/Dream-v0-Instruct-7B.

Each has the repository's config.json keys (`auto_map` included), generation_config.json, a safetensors
index over several shards in bf16, the real vocabulary size and special token ids, and its tokenizer's own
files: LLaDA a fast tokenizer (tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json); Dream a slow one that needs remote code (vocab.json, merges.txt,
added_tokens.json, tokenizer_config.json whose `auto_map` names `tokenization_dream.DreamTokenizer`, and
that module: ours, `checkpoint_code/tokenization_dream.py`, standing in for Dream's). The remote-code
modules of the models (`configuration_*.py`, `modeling_*.py`) are stand-ins too; the modeling one fails
when imported, since Sangam must never run it.

Only the shapes are tiny (2 layers, hidden 32): the embedding and head keep the full vocabulary, so the
special ids are the real ones.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from executor_helpers import checkpoint_tensors  # tests/executor (conftest.py puts it on sys.path)
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from executor.model.config import TRAITS, Family, ModelConfig
from executor.model.loading import random_model
from sangam.hardware import ModelSpec

CODE = Path(__file__).resolve().parent / "checkpoint_code"
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "t"), ("Ġt", "h"), ("Ġth", "e")]

LLADA_SPECIAL = {
    126080: "<|startoftext|>",
    126081: "<|endoftext|>",
    126336: "<|mdm_mask|>",
    126346: "<|start_header_id|>",
    126347: "<|end_header_id|>",
    126348: "<|eot_id|>",
}
LLADA_TEMPLATE = (  # Llama-3 style, as LLaDA-8B-Instruct's
    "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
DREAM_SPECIAL = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151665: "<|beginoftext|>",
    151666: "<|mask|>",
}
DREAM_TEMPLATE = (  # ChatML with a default system turn, as Qwen2.5's and Dream's
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLADA_VOCAB, DREAM_VOCAB = 126464, 152064
LLADA_CONTEXT = 4096  # max_sequence_length
DREAM_POSITIONS = 131072  # max_position_embeddings (Qwen2.5's; Dream documents 2,048)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    directory: Path
    config: ModelConfig  # what the weights were made from (context and stops as our reader should find them)


def tiny_real(family: Family) -> ModelConfig:
    """The family's tiny shapes with its real vocabulary and ids."""
    traits = TRAITS[family]
    shape = ModelSpec(
        f"{family}-tiny-real", layers=2, hidden=32, heads=4, kv_heads=4 if family is Family.LLADA else 2,
        head_dim=8, intermediate=64, vocab=LLADA_VOCAB if family is Family.LLADA else DREAM_VOCAB,
        qkv_bias=family is Family.DREAM,
    )  # fmt: skip
    return ModelConfig(
        family=family, shape=shape, rms_eps=traits.rms_eps, rope_theta=traits.rope_theta,
        mask_id=traits.mask_id, eos_ids=traits.eos_ids, context_len=traits.context_len,
    )  # fmt: skip


def llada_checkpoint(directory: Path, *, seed: int = 0) -> Checkpoint:
    """GSAI-ML/LLaDA-8B-Instruct's layout: 6 shards, a fast tokenizer."""
    config = tiny_real(Family.LLADA)
    shape = config.shape
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            "AutoModel": "modeling_llada.LLaDAModelLM",
        },
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": shape.hidden,
        "embedding_dropout": 0.0, "embedding_size": shape.vocab, "eos_token_id": 126081,
        "flash_attention": False, "include_bias": False, "include_qkv_bias": False, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": LLADA_CONTEXT,
        "mlp_hidden_size": shape.intermediate, "mlp_ratio": 4, "model_type": "llada",
        "multi_query_attention": None, "n_heads": shape.heads, "n_kv_heads": shape.kv_heads,
        "n_layers": shape.layers, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0,
        "rms_norm_eps": config.rms_eps, "rope": True, "rope_full_precision": True,
        "rope_theta": config.rope_theta, "scale_logits": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3", "use_cache": False, "vocab_size": shape.vocab,
        "weight_tying": False,
    })  # fmt: skip
    write_json(directory / "generation_config.json", {
        "_from_model_config": True, "bos_token_id": 126080, "eos_token_id": 126081, "pad_token_id": 126081,
        "transformers_version": "4.46.3",
    })  # fmt: skip
    write_shards(directory, config, shards=6, seed=seed)
    write_model_code(directory, "llada", "LLaDAConfig", "llada")
    tokenizer = byte_bpe_tokenizer()
    serialized = json.loads(tokenizer.to_str())
    serialized["model"]["vocab"] |= {text: i for i, text in LLADA_SPECIAL.items()}  # the real ids: the
    serialized["added_tokens"] = [added_token(i, text) for i, text in LLADA_SPECIAL.items()]  # vocab has them
    write_json(directory / "tokenizer.json", serialized)
    write_json(directory / "tokenizer_config.json", {
        "added_tokens_decoder": added_tokens_decoder(LLADA_SPECIAL),
        "bos_token": "<|startoftext|>", "chat_template": LLADA_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
    })  # fmt: skip
    write_json(directory / "special_tokens_map.json", {
        "bos_token": special("<|startoftext|>"), "eos_token": special("<|endoftext|>"),
        "pad_token": special("<|endoftext|>"),
    })  # fmt: skip
    return Checkpoint(directory, config)


def dream_checkpoint(directory: Path, *, seed: int = 0) -> Checkpoint:
    """Dream-org/Dream-v0-Instruct-7B's layout: 4 shards, a slow tokenizer that needs remote code."""
    config = tiny_real(Family.DREAM)
    shape = config.shape
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", {
        "architectures": ["DreamModel"], "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel",
        },
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": shape.hidden,
        "initializer_range": 0.02, "intermediate_size": shape.intermediate, "mask_token_id": 151666,
        "max_position_embeddings": DREAM_POSITIONS, "max_window_layers": shape.layers, "model_type": "Dream",
        "num_attention_heads": shape.heads, "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads, "pad_token_id": 151643, "rms_norm_eps": config.rms_eps,
        "rope_scaling": None, "rope_theta": config.rope_theta, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.46.2",
        "use_cache": True, "use_sliding_window": False, "vocab_size": shape.vocab,
    })  # fmt: skip
    write_json(directory / "generation_config.json", {
        "bos_token_id": 151643, "eos_token_id": 151643, "mask_token_id": 151666, "pad_token_id": 151643,
        "transformers_version": "4.46.2",
    })  # fmt: skip
    write_shards(directory, config, shards=4, seed=seed)
    write_model_code(directory, "dream", "DreamConfig", "Dream")
    vocab = json.loads(byte_bpe_tokenizer().to_str())["model"]["vocab"]
    write_json(directory / "vocab.json", vocab)
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    write_json(directory / "added_tokens.json", {text: i for i, text in DREAM_SPECIAL.items()})
    shutil.copy(CODE / "tokenization_dream.py", directory / "tokenization_dream.py")
    write_json(directory / "tokenizer_config.json", {
        "added_tokens_decoder": added_tokens_decoder(DREAM_SPECIAL),
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>", "chat_template": DREAM_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "errors": "replace", "mask_token": "<|mask|>",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "DreamTokenizer",
        "unk_token": None,
    })  # fmt: skip
    write_json(directory / "special_tokens_map.json", {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": special("<|beginoftext|>"),
        "eos_token": special("<|endoftext|>"), "mask_token": special("<|mask|>"),
        "pad_token": special("<|endoftext|>"),
    })  # fmt: skip
    return Checkpoint(directory, config)


def write_shards(directory: Path, config: ModelConfig, *, shards: int, seed: int) -> None:
    """The weights in HF names, bf16, split over `shards` files with model.safetensors.index.json."""
    model = random_model(config, dtype=torch.float32, seed=seed, std=0.5)  # peaked enough to commit early
    tensors = {name: t.to(torch.bfloat16).contiguous() for name, t in checkpoint_tensors(model).items()}
    names = list(tensors)  # the model's own order: embedding, layers, norm, head
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard * len(names) // shards : (shard + 1) * len(names) // shards]
        save_file({name: tensors[name] for name in part}, directory / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(
        directory / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def write_model_code(directory: Path, family: str, config_class: str, model_type: str) -> None:
    """Stand-ins for the repository's configuration and modeling modules (`auto_map` names them)."""
    (directory / f"configuration_{family}.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        f"class {config_class}(PretrainedConfig):\n    model_type = {model_type!r}\n"
    )
    (directory / f"modeling_{family}.py").write_text(
        'raise RuntimeError("a stand-in for the checkpoint\'s model code, which Sangam must never run")\n'
    )


def byte_bpe_tokenizer() -> Tokenizer:
    """A byte-level BPE over the 256 byte characters and a few merges (no special tokens)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(alphabet))}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def added_token(token: int, text: str, *, with_id: bool = True) -> dict[str, object]:
    entry: dict[str, object] = {"id": token} if with_id else {}
    return entry | {
        "content": text, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
        "special": True,
    }  # fmt: skip


def added_tokens_decoder(tokens: dict[int, str]) -> dict[str, object]:
    return {str(token): added_token(token, text, with_id=False) for token, text in tokens.items()}


def special(text: str) -> dict[str, object]:
    return {"content": text, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False))
