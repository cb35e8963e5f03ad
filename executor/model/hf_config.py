"""Read a local Hugging Face `config.json` of LLaDA or Dream into a `ModelConfig`.

Both models ship remote code, so transformers' AutoConfig cannot read them offline; the JSON is parsed here
and checked against what our transformer implements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from executor.model.config import TRAITS, Family, ModelConfig

ARCHITECTURES = {traits.architecture: family for family, traits in TRAITS.items()}


def read_config(directory: str | Path) -> ModelConfig:
    """The `ModelConfig` of the checkpoint in `directory`; ValueError for anything we do not implement."""
    path = Path(directory)
    raw = json.loads((path / "config.json").read_text())
    architecture = (raw.get("architectures") or [None])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {architecture!r} is not one of {sorted(ARCHITECTURES)}")
    family = ARCHITECTURES[architecture]
    shapes = _llada_shapes(raw) if family is Family.LLADA else _dream_shapes(raw)
    if raw.get("rope_scaling"):
        raise ValueError(f"{path}: rope_scaling {raw['rope_scaling']} is not implemented")
    traits = TRAITS[family]
    return ModelConfig(
        family=family,
        rms_eps=float(raw.get("rms_norm_eps", traits.rms_eps)),
        rope_theta=float(raw.get("rope_theta", traits.rope_theta)),
        mask_id=int(raw.get("mask_token_id", traits.mask_id)),
        eos_ids=_eos_ids(path, raw) or traits.eos_ids,
        context_len=int(
            raw.get("max_sequence_length") or raw.get("max_position_embeddings") or traits.context_len
        ),
        **shapes,
    )


def _llada_shapes(raw: dict[str, Any]) -> dict[str, Any]:
    _require(raw, "weight_tying", False)
    _require(raw, "include_bias", False)
    _require(raw, "include_qkv_bias", False)
    _require(raw, "block_type", "llama")
    heads = raw["n_heads"]
    return {
        "layers": raw["n_layers"],
        "hidden": raw["d_model"],
        "heads": heads,
        "kv_heads": raw.get("n_kv_heads") or heads,
        "head_dim": raw["d_model"] // heads,
        "intermediate": raw["mlp_hidden_size"],
        "vocab": raw.get("embedding_size") or raw["vocab_size"],  # wte rows; LLaDA pads the vocab to this
        "qkv_bias": False,
    }


def _dream_shapes(raw: dict[str, Any]) -> dict[str, Any]:
    _require(raw, "tie_word_embeddings", False)
    heads = raw["num_attention_heads"]
    return {
        "layers": raw["num_hidden_layers"],
        "hidden": raw["hidden_size"],
        "heads": heads,
        "kv_heads": raw.get("num_key_value_heads") or heads,
        "head_dim": raw.get("head_dim") or raw["hidden_size"] // heads,
        "intermediate": raw["intermediate_size"],
        "vocab": raw["vocab_size"],
        "qkv_bias": True,
    }


def _require(raw: dict[str, Any], key: str, expected: object) -> None:
    if key in raw and raw[key] != expected:
        raise ValueError(f"config.json has {key}={raw[key]!r}; only {expected!r} is implemented")


def _eos_ids(path: Path, raw: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from config.json and generation_config.json together (the latter often adds the turn end)."""
    ids = set(_as_ids(raw.get("eos_token_id")))
    generation = path / "generation_config.json"
    if generation.exists():
        ids.update(_as_ids(json.loads(generation.read_text()).get("eos_token_id")))
    return tuple(sorted(ids))


def _as_ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
