"""Checkpoint tensor names of both families and reading them, fused, from safetensors shards."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from executor.model.config import Family, ModelConfig

# Our parameter name -> the checkpoint tensors concatenated (dim 0) to make it; gate before up.
NameMap = dict[str, tuple[str, ...]]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def checkpoint_names(config: ModelConfig) -> NameMap:
    """Where every parameter of our `Transformer` comes from in the family's HF checkpoint."""
    return _llada_names(config) if config.family is Family.LLADA else _dream_names(config)


def _llada_names(config: ModelConfig) -> NameMap:
    # Traps: a block's `ff_out` is the down projection, the top-level one the head; `ff_proj` is the gate.
    root = "model.transformer"
    names: NameMap = {
        "embed.weight": (f"{root}.wte.weight",),
        "norm.weight": (f"{root}.ln_f.weight",),
        "lm_head.weight": (f"{root}.ff_out.weight",),
    }
    for i in range(config.shape.layers):
        block = f"{root}.blocks.{i}"
        names |= {
            f"layers.{i}.attn_norm.weight": (f"{block}.attn_norm.weight",),
            f"layers.{i}.attn.qkv.weight": tuple(f"{block}.{p}_proj.weight" for p in "qkv"),
            f"layers.{i}.attn.out.weight": (f"{block}.attn_out.weight",),
            f"layers.{i}.mlp_norm.weight": (f"{block}.ff_norm.weight",),
            f"layers.{i}.mlp.gate_up.weight": (f"{block}.ff_proj.weight", f"{block}.up_proj.weight"),
            f"layers.{i}.mlp.down.weight": (f"{block}.ff_out.weight",),
        }
    return names


def _dream_names(config: ModelConfig) -> NameMap:
    names: NameMap = {
        "embed.weight": ("model.embed_tokens.weight",),
        "norm.weight": ("model.norm.weight",),
        "lm_head.weight": ("lm_head.weight",),
    }
    for i in range(config.shape.layers):
        layer = f"model.layers.{i}"
        names |= {
            f"layers.{i}.attn_norm.weight": (f"{layer}.input_layernorm.weight",),
            f"layers.{i}.attn.qkv.weight": tuple(f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"),
            f"layers.{i}.attn.qkv.bias": tuple(f"{layer}.self_attn.{p}_proj.bias" for p in "qkv"),
            f"layers.{i}.attn.out.weight": (f"{layer}.self_attn.o_proj.weight",),
            f"layers.{i}.mlp_norm.weight": (f"{layer}.post_attention_layernorm.weight",),
            f"layers.{i}.mlp.gate_up.weight": (
                f"{layer}.mlp.gate_proj.weight",
                f"{layer}.mlp.up_proj.weight",
            ),
            f"layers.{i}.mlp.down.weight": (f"{layer}.mlp.down_proj.weight",),
        }
    return names


def shard_map(directory: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the safetensors file holding it (sharded with an index, or one file)."""
    index = directory / INDEX
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / SINGLE
    if not single.exists():
        raise FileNotFoundError(f"{directory} holds neither {INDEX} nor {SINGLE}")
    with safe_open(single, framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def read_fused(
    directory: Path, names: NameMap, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, Tensor]]:
    """Yield (our name, fused tensor) one at a time, so only the model's own copy stays alive."""
    files = shard_map(directory)
    _check_names(files, names)
    with ExitStack() as stack:
        handles = {
            file: stack.enter_context(safe_open(file, framework="pt", device=str(device)))
            for file in set(files.values())
        }
        for ours, sources in names.items():
            parts = [handles[files[name]].get_tensor(name).to(dtype) for name in sources]
            yield ours, parts[0] if len(parts) == 1 else torch.cat(parts)


def _check_names(files: Mapping[str, Path], names: NameMap) -> None:
    wanted = {source for sources in names.values() for source in sources}
    missing, unexpected = sorted(wanted - files.keys()), sorted(files.keys() - wanted)
    if missing or unexpected:
        raise ValueError(f"checkpoint names do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
