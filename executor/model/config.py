"""Model configs: one dataclass describes LLaDA-8B, Dream-7B and their tiny test twins."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sangam.hardware import MODELS, ModelSpec

TINY_CONTEXT = 4096  # the tiny twins' context window, as LLaDA-8B's


class Family(StrEnum):
    LLADA = "llada"
    DREAM = "dream"


@dataclass(frozen=True, slots=True)
class FamilyTraits:
    """What a family fixes beyond its shapes; config.json may override the token ids."""

    architecture: str  # config.json `architectures[0]`
    rms_eps: float
    rope_theta: float
    mask_id: int
    eos_ids: tuple[int, ...]
    logit_shift: int  # 1: the head at position i predicts token i + 1 (Dream, initialised from an AR model)
    context_len: int  # context window as the model documents it, tokens (`--max-model-len` overrides it)
    positions: int  # the most positions its config allows (random weights reach this far: timing runs)


TRAITS: dict[Family, FamilyTraits] = {
    Family.LLADA: FamilyTraits("LLaDAModelLM", 1e-5, 500_000.0, 126336, (126081, 126348), 0, 4096, 4096),
    Family.DREAM: FamilyTraits("DreamModel", 1e-6, 1_000_000.0, 151666, (151643, 151645), 1, 2048, 131072),
}
# Context windows: LLaDA 4,096, its pretraining length (config.json's max_sequence_length); Dream 2,048,
# prompt and answer together, as its model card states (its config's max_position_embeddings, 131,072, is
# Qwen2.5's). Random weights (`full_size`) are timing stand-ins that replay the paper's traces (Dream with
# prompts up to 4k plus 512 masks), so they reach the config's positions instead.


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One bidirectional pre-norm transformer (RMSNorm, RoPE, SwiGLU, untied head): its shape, as the cost
    models know it, and the numerics and token ids the executor needs beyond it."""

    family: Family
    shape: ModelSpec
    rms_eps: float
    rope_theta: float
    mask_id: int
    eos_ids: tuple[int, ...]
    context_len: int  # tokens: a prompt plus its mask buffer must fit

    def __post_init__(self) -> None:
        shape = self.shape
        if shape.heads % shape.kv_heads:
            raise ValueError(f"{shape.heads} query heads do not group over {shape.kv_heads} KV heads")
        for name, token in [("mask", self.mask_id), *(("eos", t) for t in self.eos_ids)]:
            if not 0 <= token < shape.vocab:
                raise ValueError(f"{name} token {token} lies outside the vocabulary of {shape.vocab}")

    @property
    def logit_shift(self) -> int:
        return TRAITS[self.family].logit_shift


def full_size(family: Family) -> ModelConfig:
    """LLaDA-8B or Dream-7B, shaped by `sangam.hardware.MODELS` so the cost models and the executor agree."""
    traits = TRAITS[family]
    return ModelConfig(
        family=family,
        shape=MODELS["llada-8b" if family is Family.LLADA else "dream-7b"],
        rms_eps=traits.rms_eps,
        rope_theta=traits.rope_theta,
        mask_id=traits.mask_id,
        eos_ids=traits.eos_ids,
        context_len=traits.positions,
    )


def tiny(family: Family) -> ModelConfig:
    """A two-layer twin for CPU tests: LLaDA keeps MHA, Dream keeps GQA and the qkv bias."""
    traits = TRAITS[family]
    return ModelConfig(
        family=family,
        shape=ModelSpec(
            f"{family}-tiny",
            layers=2,
            hidden=64,
            heads=4,
            kv_heads=4 if family is Family.LLADA else 2,
            head_dim=16,
            intermediate=128,
            vocab=300,
            qkv_bias=family is Family.DREAM,
        ),
        rms_eps=traits.rms_eps,
        rope_theta=traits.rope_theta,
        mask_id=299,
        eos_ids=(298,),
        context_len=TINY_CONTEXT,
    )
