"""Our tiny LLaDA and Dream against transformers' Llama and Qwen2 run with non-causal attention."""

from __future__ import annotations

import pytest
import torch
from executor_helpers import dense_logits
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from executor.model.config import Family, tiny
from executor.model.loading import random_model
from executor.model.transformer import Transformer


def hf_twin(model: Transformer) -> nn.Module:
    """The transformers model of the same shape (Llama for LLaDA, Qwen2 for Dream) with our weights."""
    c = model.config
    shape = {
        "vocab_size": c.shape.vocab,
        "hidden_size": c.shape.hidden,
        "intermediate_size": c.shape.intermediate,
        "num_hidden_layers": c.shape.layers,
        "num_attention_heads": c.shape.heads,
        "num_key_value_heads": c.shape.kv_heads,
        "rms_norm_eps": c.rms_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "tie_word_embeddings": False,
        "max_position_embeddings": 1024,
    }
    if c.family is Family.LLADA:
        twin: nn.Module = LlamaForCausalLM(LlamaConfig(**shape, attention_bias=False))
    else:
        twin = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=False))
    _copy_weights(model, twin)
    return twin.eval()


@torch.no_grad()
def _copy_weights(model: Transformer, twin: nn.Module) -> None:
    c = model.config.shape
    sizes = [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim]
    body = twin.model
    body.embed_tokens.weight.copy_(model.embed.weight)
    body.norm.weight.copy_(model.norm.weight)
    twin.lm_head.weight.copy_(model.lm_head.weight)
    for ours, theirs in zip(model.layers, body.layers, strict=True):
        attn = theirs.self_attn
        for proj, weight in zip(
            (attn.q_proj, attn.k_proj, attn.v_proj), ours.attn.qkv.weight.split(sizes), strict=True
        ):
            proj.weight.copy_(weight)
        if c.qkv_bias:
            for proj, bias in zip(
                (attn.q_proj, attn.k_proj, attn.v_proj), ours.attn.qkv.bias.split(sizes), strict=True
            ):
                proj.bias.copy_(bias)
        attn.o_proj.weight.copy_(ours.attn.out.weight)
        gate, up = ours.mlp.gate_up.weight.chunk(2)
        theirs.mlp.gate_proj.weight.copy_(gate)
        theirs.mlp.up_proj.weight.copy_(up)
        theirs.mlp.down_proj.weight.copy_(ours.mlp.down.weight)
        theirs.input_layernorm.weight.copy_(ours.attn_norm.weight)
        theirs.post_attention_layernorm.weight.copy_(ours.mlp_norm.weight)


@torch.inference_mode()
def hf_logits(twin: nn.Module, tokens: Tensor, *, causal: bool) -> Tensor:
    # A ready 4D additive mask is used as given, which turns off transformers' causal masking.
    mask = None if causal else torch.zeros(1, 1, len(tokens), len(tokens))
    return twin(input_ids=tokens[None], attention_mask=mask).logits[0]


@pytest.mark.parametrize("family", list(Family))
def test_matches_transformers_non_causal(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=1, std=0.2)
    twin = hf_twin(model)
    tokens = torch.randint(0, model.config.shape.vocab, (80,), generator=torch.Generator().manual_seed(2))
    ours = dense_logits(model, tokens)
    theirs = hf_logits(twin, tokens, causal=False)
    assert (ours - theirs).abs().max() < 1e-4
    # The check has teeth: causal attention changes every position but the last.
    assert (hf_logits(twin, tokens, causal=True) - theirs)[:-1].abs().amax(-1).min() > 1e-3
