"""Weight loading from local HF directories in both naming schemes, and the full-size shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from executor_helpers import hf_config_json, save_checkpoint
from safetensors.torch import load_file, save_file

from executor.model.config import TRAITS, Family, full_size, tiny
from executor.model.hf_config import read_config
from executor.model.loading import load_checkpoint, random_model
from executor.model.transformer import Transformer
from sangam.hardware import MODELS


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("family", list(Family))
def test_checkpoint_round_trip(family: Family, shards: int, tmp_path: Path) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=4)
    save_checkpoint(model, tmp_path, shards=shards)
    loaded = load_checkpoint(tmp_path, dtype=torch.float32)
    # a checkpoint's window is what its family documents (Dream 2048, below the tiny twin's 4096); its
    # shape is named after its directory
    shape = replace(model.config.shape, name=tmp_path.name)
    assert loaded.config == replace(model.config, shape=shape, context_len=TRAITS[family].context_len)
    expected, got = model.state_dict(), loaded.state_dict()
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_loading_casts_to_the_requested_dtype(tmp_path: Path) -> None:
    save_checkpoint(random_model(tiny(Family.DREAM), dtype=torch.float32), tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_checkpoint_names_are_the_real_ones(tmp_path: Path) -> None:
    save_checkpoint(random_model(tiny(Family.LLADA), dtype=torch.float32), tmp_path)
    names = load_file(tmp_path / "model.safetensors").keys()
    assert {"model.transformer.ff_out.weight", "model.transformer.blocks.1.ff_proj.weight"} <= names
    assert "model.transformer.blocks.1.ff_out.weight" in names


def test_missing_tensor_is_an_error(tmp_path: Path) -> None:
    save_checkpoint(random_model(tiny(Family.DREAM), dtype=torch.float32), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"k_proj\.bias"):
        load_checkpoint(tmp_path)


def test_unknown_architecture_is_refused(tmp_path: Path) -> None:
    raw = hf_config_json(tiny(Family.DREAM)) | {"architectures": ["Qwen2ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="Qwen2ForCausalLM"):
        read_config(tmp_path)


def test_generation_config_adds_eos_ids(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(hf_config_json(tiny(Family.LLADA))))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [298, 297]}))
    assert read_config(tmp_path).eos_ids == (297, 298)


@pytest.mark.parametrize(("family", "name"), [(Family.LLADA, "llada-8b"), (Family.DREAM, "dream-7b")])
def test_full_size_model_matches_the_hardware_spec(family: Family, name: str) -> None:
    config = full_size(family)
    with torch.device("meta"):
        model = Transformer(config)
    # The spec counts matmul weights and embeddings only: add the norms and Dream's qkv bias.
    norms = (2 * config.shape.layers + 1) * config.shape.hidden
    bias = config.shape.layers * config.shape.qkv_width if config.shape.qkv_bias else 0
    assert sum(p.numel() for p in model.parameters()) == MODELS[name].params + norms + bias


def test_random_model_is_allocated_in_the_requested_dtype() -> None:
    model = random_model(tiny(Family.LLADA), seed=1)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    assert torch.equal(model.embed.weight, random_model(tiny(Family.LLADA), seed=1).embed.weight)
