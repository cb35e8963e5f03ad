"""Model and GPU facts the scheduler and the cost models share (shapes, bytes, pages)."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK = 32  # tokens per Fast-dLLM block; a decode step forwards one block
PAGE = 16  # tokens per KV page
GIB = 1 << 30
# Bytes per stored K or V element, per `--kv-cache-dtype` (vLLM's flag): auto keeps the model's bf16,
# fp8 stores E4M3, so a page takes half the bytes and the same memory holds twice the pages.
KV_DTYPE_BYTES = {"auto": 2, "fp8": 1}


def pages_for(tokens: int) -> int:
    """KV pages needed to hold `tokens` positions."""
    return -(-tokens // PAGE)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of one dLLM; enough to count FLOPs, weight bytes and KV bytes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """K and V of every layer for one position, stored as `kv_dtype` (`KV_DTYPE_BYTES`)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_DTYPE_BYTES[kv_dtype]

    @property
    def qkv_width(self) -> int:
        """Columns of the fused q, k and v projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def layer_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return q + kv + o + mlp

    @property
    def params(self) -> int:
        """All parameters: body, input embedding and untied LM head."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        return 2 * self.params

    def page_bytes(self, kv_dtype: str = "auto") -> int:
        return PAGE * self.kv_bytes_per_token(kv_dtype)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """An accelerator: memory and the peaks that bound an iteration."""

    name: str
    memory_gib: float
    tflops: float  # achievable dense bf16 matmul peak
    tb_per_s: float  # achievable HBM copy bandwidth


MODELS: dict[str, ModelSpec] = {
    "llada-8b": ModelSpec("llada-8b", 32, 4096, 32, 32, 128, 12288, 126464, qkv_bias=False),
    "dream-7b": ModelSpec("dream-7b", 28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True),
}

# H200 peaks measured on the lent card (docs/design.md section 5). H100 SXM shares the compute die,
# so its matmul peak is taken as equal and its bandwidth scaled by 3.35 / 4.8.
GPUS: dict[str, GPUSpec] = {
    "h200": GPUSpec("h200", 139.8, 790.0, 4.3),
    "h100": GPUSpec("h100", 79.6, 790.0, 4.3 * 3.35 / 4.8),
}

MEMORY_UTILISATION = 0.9  # share of GPU memory the worker may take
ACTIVATION_RESERVE_GIB = 8.0  # activations, CUDA graphs and workspace kept out of the KV pool


def kv_pages(model: ModelSpec, gpu: GPUSpec, workers_per_gpu: int = 1, kv_dtype: str = "auto") -> int:
    """Default KV pages per worker: usable memory minus weights and activations, split between the
    workers that share the GPU (each holds its own weights), in pages of `kv_dtype`."""
    free = gpu.memory_gib * MEMORY_UTILISATION * GIB
    free -= workers_per_gpu * (model.weight_bytes + ACTIVATION_RESERVE_GIB * GIB)
    return max(int(free // workers_per_gpu // model.page_bytes(kv_dtype)), 0)


def pages_in_kv_dtype(pages: int, kv_dtype: str, stored: str = "auto") -> int:
    """The pages of `kv_dtype` that the memory of `pages` pages of `stored` holds (a testbed's or a
    profile's pages are its worker's, bf16 unless its profile was measured with an FP8 KV cache)."""
    return pages * KV_DTYPE_BYTES[stored] // KV_DTYPE_BYTES[kv_dtype]


def lookup_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None


def lookup_gpu(name: str) -> GPUSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r} (known: {', '.join(GPUS)})") from None
