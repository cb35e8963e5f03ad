"""One forward for a whole microbatch: prefills and decodes packed together over the paged KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from executor.attention import AttentionBackend
from executor.kv_cache import PagedKVCache
from executor.microbatch import ForwardItem, MicrobatchPlan, plan_microbatch
from executor.models.transformer import Transformer
from sangam.hardware import BLOCK


class PagedAttention:
    """The model's `LayerAttention` for one planned microbatch: store this forward's K/V, then attend.

    Writing before attending lets a decode's block queries see the block's fresh K/V (Fast-dLLM dual cache)
    while every other position keeps what its last prefill wrote.
    """

    def __init__(self, cache: PagedKVCache, backend: AttentionBackend, plan: MicrobatchPlan) -> None:
        self.cache, self.backend, self.plan = cache, backend, plan

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        rows = self.plan.write_rows
        self.cache.write(layer, self.plan.slots, k[rows], v[rows])
        return self.backend.run(q, self.cache.layers[layer])


class ModelRunner:
    """Runs mixed prefill/decode microbatches of one model against one worker's paged KV cache."""

    def __init__(self, model: Transformer, cache: PagedKVCache, backend: AttentionBackend) -> None:
        self.model, self.cache, self.backend = model, cache, backend

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem]) -> Tensor:
        """Logits (len(items), BLOCK, vocab) for each item's 32 block positions, in item order.

        Every item's request must already hold its pages in the cache's pool (`pages_for(S)` of them),
        and a decode must follow a prefill of the same block on this cache (or a KV transfer into it).
        """
        tables = [self.cache.page_table(item.request_id) for item in items]
        plan = plan_microbatch(items, tables, self.model.config.logit_shift, self.model.device)
        self.backend.plan(plan.layout)
        logits = self.model(
            plan.tokens, plan.positions, PagedAttention(self.cache, self.backend, plan), plan.head_rows
        )
        return logits.view(len(items), BLOCK, -1)
