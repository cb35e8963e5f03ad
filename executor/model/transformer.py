"""The bidirectional transformer both families share, over packed (ragged) tokens.

The model never sees a KV cache or a batch layout: each layer hands its post-RoPE q, k, v to a
`LayerAttention` callable, which decides where K/V live (paged cache, or a dense test reference) and
how the ragged items attend. So the same module serves mixed prefill/decode microbatches, tests, and
later CUDA-graph capture.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from executor.model.config import ModelConfig
from executor.model.fp8 import Fp8Linear, Fp8Rows
from executor.model.layers import RMSNorm, Rotary, SwiGLU


class LayerAttention(Protocol):
    """Non-causal attention for one layer: q (T, heads, d), k and v (T, kv_heads, d) -> (T, heads, d)."""

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


def split_heads(qkv: Tensor, heads: int, kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """q (T, heads, d), k and v (T, kv_heads, d): views of the q/k/v projection's rows (T, qkv_width)."""
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim), v.view(-1, kv_heads, head_dim)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        shape = config.shape
        self.config = config
        self.qkv: nn.Module = nn.Linear(shape.hidden, shape.qkv_width, bias=shape.qkv_bias)  # or an Fp8Linear
        self.out = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)

    def forward(
        self, x: Tensor | Fp8Rows, rope: Rotary, layer: int, attend: LayerAttention, qkv: Tensor | None = None
    ) -> Tensor:
        """`qkv`: rows (T, qkv_width) the q/k/v projection writes into (piecewise graphs' static rows)."""
        if qkv is None:
            qkv = self.qkv(x)
        elif isinstance(self.qkv, Fp8Linear):
            self.qkv(x, out=qkv)
        else:
            qkv.copy_(self.qkv(x))
        shape = self.config.shape
        q, k, v = split_heads(qkv, shape.heads, shape.kv_heads, shape.head_dim)
        q, k = rope(q, k)
        return self.out(attend(layer, q, k, v).flatten(1))


class Layer(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)), then h + mlp(norm(h)).

    Over the residual stream, each add is deferred to the norm after it (`RMSNorm.add_norm`, one fused kernel
    on a GPU): the block takes the previous block's MLP output (None for the first block) and the stream
    before it, and hands on its own. Before an `Fp8Linear` the norm also quantizes its output
    (`RMSNorm.add_norm_quantized`).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.shape.hidden
        self.attn_norm = RMSNorm(hidden, config.rms_eps)
        self.attn = SelfAttention(config)
        self.mlp_norm = RMSNorm(hidden, config.rms_eps)
        self.mlp = SwiGLU(hidden, config.shape.intermediate)

    def forward(
        self,
        delta: Tensor | None,
        residual: Tensor,
        rope: Rotary,
        layer: int,
        attend: LayerAttention,
        qkv: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(this block's MLP output, the stream it adds to) from the last block's and its stream."""
        normed, residual = _add_norm(self.attn_norm, self.attn.qkv, delta, residual)
        attended = self.attn(normed, rope, layer, attend, qkv)
        normed, residual = _add_norm(self.mlp_norm, self.mlp.gate_up, attended, residual)
        return self.mlp(normed), residual


def _add_norm(
    norm: RMSNorm, consumer: nn.Module, delta: Tensor | None, residual: Tensor
) -> tuple[Tensor | Fp8Rows, Tensor]:
    """(norm(residual + delta), residual + delta) (delta None: the norm of residual), the norm quantized
    when `consumer`, the layer it feeds, is an `Fp8Linear`."""
    if isinstance(consumer, Fp8Linear):
        return norm.add_norm_quantized(delta, residual)
    if delta is None:
        return norm(residual), residual
    return norm.add_norm(delta, residual)


class Transformer(nn.Module):
    """LLaDA-8B / Dream-7B body and untied head with fused qkv and gate_up weights."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        shape = config.shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Layer(config) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, config.rms_eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: Tensor, positions: Tensor, attend: LayerAttention, head_rows: Tensor) -> Tensor:
        """Logits (len(head_rows), vocab) at packed rows `head_rows` of `tokens` (T,) at `positions` (T,).

        The head runs only on `head_rows`; the caller picks them (block positions, shifted for Dream).
        """
        return self.head(*self.body(tokens, positions, attend), head_rows)

    def body(
        self, tokens: Tensor, positions: Tensor, attend: LayerAttention, qkv: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Every layer over `tokens` (T,): the last layer's MLP output and the residual stream it adds to.
        `qkv` (T, qkv_width), when given, holds each layer's q/k/v projection in turn (RoPE applied in place
        where the fused kernel serves)."""
        rope = Rotary(positions, self.config.shape.head_dim, self.config.rope_theta)
        delta, residual = self.layers[0](None, self.embed(tokens), rope, 0, attend, qkv)
        for index in range(1, len(self.layers)):
            delta, residual = self.layers[index](delta, residual, rope, index, attend, qkv)
        return delta, residual

    def head(self, delta: Tensor, residual: Tensor, head_rows: Tensor) -> Tensor:
        """Logits at packed rows `head_rows` of the body's output."""
        return self.lm_head(self.norm.add_norm(delta[head_rows], residual[head_rows])[0])

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype
