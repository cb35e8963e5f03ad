"""Shared helpers for the executor tests: a dense (non-paged) reference forward, checkpoint writers, and a
decode item's next step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from executor.model.attention import indptr
from executor.model.checkpoint import checkpoint_names
from executor.model.config import Family, ModelConfig, tiny
from executor.model.forward import ModelRunner
from executor.model.microbatch import ForwardItem, Phase
from executor.model.prefill_attention import PrefillAttention, TorchPrefillAttention
from executor.model.transformer import Transformer, split_heads
from sangam.hardware import BLOCK, pages_for


def bits(kv: Tensor) -> Tensor:
    """A KV tensor's raw bits as integers of its width: the cache starts as torch.empty, so a slot never
    written may hold NaNs, and NaN != NaN would make an untouched slot look changed."""
    return kv.view({2: torch.int16, 4: torch.int32}[kv.element_size()])


def dense_attention(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every token of one sequence attends to every other: the non-paged reference."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True
    )
    return out.transpose(0, 1)


@torch.inference_mode()
def dense_logits(model: Transformer, tokens: Tensor) -> Tensor:
    """Logits (S, vocab) at every position of one sequence, no cache involved."""
    positions = torch.arange(len(tokens))
    return model(tokens, positions, dense_attention, positions)


def dense_block_logits(model: Transformer, tokens: Tensor, block_start: int) -> Tensor:
    """The logits (32, vocab) that predict the block's tokens, read one row to the left for Dream."""
    start = block_start - model.config.logit_shift
    return dense_logits(model, tokens)[start : start + BLOCK]


def checkpoint_tensors(model: Transformer) -> dict[str, Tensor]:
    """The model's weights split back into the family's HF checkpoint names."""
    config, state = model.config, model.state_dict()
    q, kv = config.shape.heads * config.shape.head_dim, config.shape.kv_heads * config.shape.head_dim
    tensors: dict[str, Tensor] = {}
    for ours, sources in checkpoint_names(config).items():
        sizes = [q, kv, kv] if ".qkv." in ours else [len(state[ours]) // len(sources)] * len(sources)
        for name, part in zip(sources, state[ours].split(sizes), strict=True):
            tensors[name] = part.clone()
    return tensors


def reshaped(config: ModelConfig, **shape: int) -> ModelConfig:
    """`config` with some of its shape's dimensions changed."""
    return replace(config, shape=replace(config.shape, **shape))


def hf_config_json(config: ModelConfig) -> dict[str, object]:
    """config.json as each family's HF repository writes it (the keys our reader uses)."""
    if config.family is Family.LLADA:
        return {
            "architectures": ["LLaDAModelLM"],
            "model_type": "llada",
            "n_layers": config.shape.layers,
            "d_model": config.shape.hidden,
            "n_heads": config.shape.heads,
            "n_kv_heads": config.shape.kv_heads,
            "mlp_hidden_size": config.shape.intermediate,
            "mlp_ratio": 4,
            "vocab_size": config.shape.vocab,
            "embedding_size": config.shape.vocab,
            "rms_norm_eps": config.rms_eps,
            "rope_theta": config.rope_theta,
            "weight_tying": False,
            "include_bias": False,
            "block_type": "llama",
            "mask_token_id": config.mask_id,
            "eos_token_id": config.eos_ids[0],
            "max_sequence_length": config.context_len,
        }
    return {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "num_hidden_layers": config.shape.layers,
        "hidden_size": config.shape.hidden,
        "num_attention_heads": config.shape.heads,
        "num_key_value_heads": config.shape.kv_heads,
        "intermediate_size": config.shape.intermediate,
        "vocab_size": config.shape.vocab,
        "rms_norm_eps": config.rms_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "mask_token_id": config.mask_id,
        "eos_token_id": config.eos_ids[0],
        "max_position_embeddings": config.context_len,
    }


def save_checkpoint(model: Transformer, directory: Path, *, shards: int = 1) -> None:
    """Write config.json and safetensors (one file, or `shards` files with an index) in HF naming."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config_json(model.config)))
    tensors = checkpoint_tensors(model)
    if shards == 1:
        save_file(tensors, directory / "model.safetensors")
        return
    names = sorted(tensors)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        save_file({name: tensors[name] for name in part}, directory / file)
        weight_map |= dict.fromkeys(part, file)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def committed(item: ForwardItem, seed: int, vocab: int = 50) -> ForwardItem:
    """The item's next decode step: the same block with about 30% of its positions set to random tokens."""
    tokens = item.tokens.clone()
    picked = torch.rand(BLOCK, generator=torch.Generator().manual_seed(seed)) < 0.3
    block = tokens[item.block_start : item.block_start + BLOCK]
    generator = torch.Generator().manual_seed(seed)
    block[picked] = torch.randint(0, vocab, (int(picked.sum()),), generator=generator)
    return ForwardItem(item.request_id, Phase.DECODE, tokens, item.block_start)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """Mean absolute difference over the mean magnitude of `expected`, in float32."""
    assert actual.shape == expected.shape and actual.isfinite().all()
    return float((actual.float() - expected.float()).abs().mean() / expected.float().abs().mean())


def small_config(family: Family, head_dim: int = 128) -> ModelConfig:
    """A two-layer model with the full-size head_dim: LLaDA keeps MHA, Dream GQA, the bias and the shift."""
    kv_heads = 4 if family is Family.LLADA else 2
    return reshaped(
        tiny(family), hidden=512, heads=4, kv_heads=kv_heads, head_dim=head_dim, intermediate=1024
    )


def run_microbatch(
    runner: ModelRunner, shapes: Sequence[tuple[int, Phase]], seed: int = 5
) -> tuple[list[ForwardItem], Tensor]:
    """One microbatch of (prompt, phase) items, each a random prompt and 64 masks, a decode's block
    prefilled first, through `runner`: the items and their logits."""
    config = runner.model.config
    generator = torch.Generator().manual_seed(seed)
    items = []
    for rid, (prompt, phase) in enumerate(shapes):
        ids = torch.randint(0, config.mask_id, (prompt,), generator=generator)
        tokens = torch.cat([ids, torch.full((64,), config.mask_id)])
        runner.cache.pool.allocate(rid, pages_for(len(tokens)))
        if phase is Phase.DECODE:
            runner.forward([ForwardItem(rid, Phase.PREFILL, tokens, prompt)])
        items.append(ForwardItem(rid, phase, tokens, prompt))
    return items, runner.forward(items)


def check_prefill_attention(attention: PrefillAttention, heads: int, kv_heads: int, head_dim: int) -> None:
    """`attention` over its own rows equals SDPA per sequence (bf16 on CUDA, q/k/v strided views of one q/k/v
    projection): ragged, a single row, whole 128-row tiles, and each a replan. Every row must be written."""
    generator = torch.Generator(device="cuda").manual_seed(heads * kv_heads)
    reference = TorchPrefillAttention()
    for lengths in ([300, 77, 1000], [1, 2048], [33], [256, 128]):
        width = (heads + 2 * kv_heads) * head_dim
        qkv = torch.randn(sum(lengths), width, dtype=torch.bfloat16, device="cuda", generator=generator)
        q, k, v = split_heads(qkv, heads, kv_heads, head_dim)
        offsets = indptr(lengths)
        expected, actual = torch.empty_like(q), torch.full_like(q, float("nan"))
        reference.plan(offsets)
        reference.run(q, k, v, expected)
        attention.plan(offsets)
        attention.run(q, k, v, actual)
        assert relative_error(actual, expected) < 1e-2  # also: every row written (no NaN left)
        assert float((actual.float() - expected.float()).abs().max()) < 0.05
