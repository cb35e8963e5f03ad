"""An iteration-time model from FLOPs and bytes, fitted to one measured LLaDA-8B layer on the H200.

One layer of a microbatch with prefills over S_i tokens and decodes attending to C_j cached positions:

    linear    max(2 * layer_params * tokens / flops, layer weight bytes / bandwidth)
              tokens = sum(S_i) + 32 * decodes (QKV, O and gated MLP; a roofline over the whole group)
    prefill   4 * S_i^2 * heads * head_dim FLOPs each (non-causal: every query sees every key)
    decode    max(4 * 32 * C_j * heads * head_dim FLOPs, C_j positions of this layer's K and V) each
    + a fixed per-layer overhead

and once per iteration the LM head over the 32 block positions of every request (a roofline against
reading the head weights) plus a fixed host overhead. Each rate is a measured peak of the `GPUSpec` times
one of the efficiencies below; the same efficiencies serve every model and GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from sangam.batcher import Microbatch
from sangam.hardware import BLOCK, GPUSpec, ModelSpec

# Shares of GPUSpec.tflops (measured bf16 matmul peak) and GPUSpec.tb_per_s (measured copy bandwidth),
# fitted by minimising the worst relative error over the five LLaDA-8B layer timings of docs/design.md
# section 5 (all within 3%). Each is named after the measurement that pins it.
LINEAR_EFFICIENCY = 0.92  # ~727 TFLOP/s: the 2048- and 8192-token prefills (linear in S)
WEIGHT_READ_EFFICIENCY = 0.93  # ~4.0 TB/s: the batch-1 decode, which mostly streams the layer's weights
PREFILL_ATTENTION_EFFICIENCY = 0.64  # ~506 TFLOP/s: what the 8192-token prefill adds beyond linear in S
KV_READ_EFFICIENCY = 0.72  # ~3.1 TB/s: the slope from batch 8 to batch 64 (each decode reads 30 MB of KV)
LAYER_OVERHEAD_S = 57e-6  # kernel launches, norms, RoPE: what the batch-1 decode leaves after its reads
# Assumed, not measured: 32 queries (times the GQA group) make a short tile that keeps the tensor cores
# partly idle. LLaDA's MHA decode stays memory-bound whatever this is; it binds only for GQA (Dream).
DECODE_ATTENTION_EFFICIENCY = 0.40
# Assumed, not measured: scheduling, confidence sampling over the block logits and host work once per
# iteration, outside the layer timings of section 5.
ITERATION_OVERHEAD_S = 1e-3


class AnalyticCostModel:
    """`CostModel` for one model on one GPU, from FLOPs, bytes and the efficiencies above.

    An empty microbatch costs `ITERATION_OVERHEAD_S` alone: the worker still runs its host loop, but
    launches no forward.
    """

    __slots__ = (
        "_decode_s_per_position",
        "_head_s_per_request",
        "_head_weights_s",
        "_layers",
        "_linear_s_per_token",
        "_prefill_s_per_square",
        "_weights_s",
        "gpu",
        "model",
    )

    def __init__(self, model: ModelSpec, gpu: GPUSpec) -> None:
        self.model = model
        self.gpu = gpu
        flops = gpu.tflops * 1e12
        bandwidth = gpu.tb_per_s * 1e12
        width = model.heads * model.head_dim
        self._layers = model.layers
        self._linear_s_per_token = 2 * model.layer_params / (LINEAR_EFFICIENCY * flops)
        self._weights_s = 2 * model.layer_params / (WEIGHT_READ_EFFICIENCY * bandwidth)
        self._prefill_s_per_square = 4 * width / (PREFILL_ATTENTION_EFFICIENCY * flops)
        # Compute and KV bytes both grow linearly with the context, so their max is one rate per position.
        decode_compute = 4 * BLOCK * width / (DECODE_ATTENTION_EFFICIENCY * flops)
        decode_memory = model.kv_bytes_per_token() / model.layers / (KV_READ_EFFICIENCY * bandwidth)
        self._decode_s_per_position = max(decode_compute, decode_memory)
        head_params = model.vocab * model.hidden
        self._head_s_per_request = BLOCK * 2 * head_params / (LINEAR_EFFICIENCY * flops)
        self._head_weights_s = 2 * head_params / (WEIGHT_READ_EFFICIENCY * bandwidth)

    def seconds(self, mb: Microbatch) -> float:
        """The wall time of one iteration of this microbatch on one worker."""
        if not mb.decodes and not mb.prefills:
            return ITERATION_OVERHEAD_S
        tokens = BLOCK * len(mb.decodes)
        squares = 0
        for req in mb.prefills:
            s = req.seq_len
            tokens += s
            squares += s * s
        context = sum([req.seq_len for req in mb.decodes])
        head = max((len(mb.decodes) + len(mb.prefills)) * self._head_s_per_request, self._head_weights_s)
        return self._layers * self._layer(tokens, squares, context) + head + ITERATION_OVERHEAD_S

    def layer_seconds(self, prefill_lens: Sequence[int], decode_contexts: Sequence[int]) -> float:
        """One layer's forward over prefills of these lengths and decodes at these contexts (0 if none)."""
        if not prefill_lens and not decode_contexts:
            return 0.0
        tokens = sum(prefill_lens) + BLOCK * len(decode_contexts)
        return self._layer(tokens, sum(s * s for s in prefill_lens), sum(decode_contexts))

    def _layer(self, tokens: int, squares: int, context: int) -> float:
        linear = max(tokens * self._linear_s_per_token, self._weights_s)
        attention = squares * self._prefill_s_per_square + context * self._decode_s_per_position
        return linear + attention + LAYER_OVERHEAD_S
