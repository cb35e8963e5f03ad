"""FP8 on a CUDA GPU of compute capability >= 8.9: the Triton quantizers against the torch reference,
the scaled GEMM against the dequantizing reference, CUDA graphs over a quantized model, and the accuracy
against bf16 on the same random weights (which bounds numerical error only: issue 30, item 3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor.model import fp8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
        reason="needs a CUDA GPU with FP8 tensor cores",
    ),
]

# Measured on an H200 (docs/executor-performance.md, "FP8"), with margin. Random weights amplify any
# perturbation through the layers (bf16 with torch attention instead of FlashInfer already moves the
# logits by a fraction of what FP8 does), so these bound numerical error only; a broken quantization
# agrees on about 1 / vocab of the argmaxes.
LOGITS_ERROR = 0.45  # ||fp8 - bf16|| / ||bf16|| of block logits (measured 0.33 LLaDA, 0.35 Dream)
LOGITS_TOP1 = 0.25  # argmax agreement of those block logits (measured 0.36-0.66)
FORCED_TOP1 = 0.03  # argmax agreement over masked positions, on bf16's generation states (0.10-0.13)


def close_in_e4m3(got: torch.Tensor, expected: torch.Tensor) -> None:
    """All values within one E4M3 step of each other, nearly all identical (division rounds differently)."""
    got, expected = got.float(), expected.float()
    assert ((got - expected).abs() <= expected.abs() * 2**-3 + 2**-9).all()
    assert float((got == expected).float().mean()) > 0.999


@pytest.mark.parametrize("rows", [1, 7, 264])
@pytest.mark.parametrize("width", [3584, 4096, 12288, 18944])
def test_the_triton_row_quantizer_matches_torch(rows: int, width: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(rows * width)
    x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
    x[:, :3] *= 50.0  # outlier channels
    if rows > 1:
        x[rows // 2] = 0.0  # a padding row: finite scale, zero values
    values, scale = fp8.quantize_rows(x)
    assert fp8._kernels(x) is not None, "the Triton kernels should serve on CUDA"
    expected_scale = fp8.scales(x)
    torch.testing.assert_close(scale, expected_scale, rtol=1e-6, atol=0)
    close_in_e4m3(values, fp8.to_fp8(x, expected_scale))


@pytest.mark.parametrize("width", [128, 12288, 18944])
def test_the_fused_silu_mul_quantizer_matches_torch_in_fp32(width: int) -> None:
    gate_up = (torch.randn(64, 2 * width, device="cuda") * 3).to(torch.bfloat16)
    values, scale = fp8.silu_mul_quantize_rows(gate_up)
    gate, up = gate_up.float().chunk(2, dim=-1)
    product = F.silu(gate) * up
    expected_scale = fp8.scales(product)
    torch.testing.assert_close(scale, expected_scale, rtol=1e-5, atol=0)
    close_in_e4m3(values, fp8.to_fp8(product, expected_scale))


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 264])
@pytest.mark.parametrize("width", [3584, 4096])
def test_the_fused_add_rmsnorm_quantizer_matches_torch_in_fp32(add: bool, rows: int, width: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(rows + width)
    residual = (torch.randn(rows, width, device="cuda", generator=g) * 4).to(torch.bfloat16)
    x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.rand(width, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    expected_stream = residual + x if add else residual.clone()
    fused = fp8.add_rmsnorm_quantize_rows(x if add else None, residual, weight, 1e-5)
    assert fused is not None, "the Triton kernel should serve on CUDA"
    values, scale = fused
    assert torch.equal(residual, expected_stream)  # the sum, rounded to bf16, in place
    h = expected_stream.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    expected_scale = fp8.scales(normed)
    torch.testing.assert_close(scale, expected_scale, rtol=1e-5, atol=0)
    close_in_e4m3(values, fp8.to_fp8(normed, expected_scale))


class CountingKernel:
    """A Triton kernel whose own launches (`kernel[grid](...)`) are counted."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid: object) -> object:
        self.launches += 1
        return self.kernel[grid]  # type: ignore[index]


def test_launches_through_the_compiled_handle_match_triton_s_own_for_each_alignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from executor.model import fp8_kernels

    g = torch.Generator(device="cuda").manual_seed(5)
    buffer = torch.randn(64 * 4096 + 1, device="cuda", generator=g).to(torch.bfloat16)
    aligned = buffer[:-1].view(64, 4096)
    misaligned = buffer[1:].view(64, 4096)  # the same strides, 2 bytes off a 16-byte boundary
    expected = {id(x): (fp8.to_fp8(x, fp8.scales(x)), fp8.scales(x)) for x in (aligned, misaligned)}
    launcher = fp8_kernels._QUANTIZE_ROWS
    counting = CountingKernel(launcher.kernel)
    monkeypatch.setattr(launcher, "kernel", counting)
    monkeypatch.setattr(launcher, "compiled", {})
    for _ in range(3):  # a signature's first launch goes through Triton, the later ones through its handle
        for x in (aligned, misaligned):
            values, scale = fp8_kernels.quantize_rows(x)
            torch.testing.assert_close(scale, expected[id(x)][1], rtol=1e-6, atol=0)
            close_in_e4m3(values, expected[id(x)][0])
    assert sorted(key[0][2] for key in launcher.compiled) == [False, True]  # one kernel per alignment
    assert counting.launches == (2 if fp8_kernels._COMPILED_TAKES_ALL else 6)


@pytest.mark.parametrize(("k", "n", "bias"), [(4096, 12288, False), (3584, 4608, True), (18944, 3584, False)])
@pytest.mark.parametrize("rows", [8, 264, 2048])
def test_the_scaled_gemm_matches_the_dequantizing_reference(k: int, n: int, bias: bool, rows: int) -> None:
    linear = torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    if bias:
        torch.nn.init.normal_(linear.bias, 0.0, 2.0)
    layer = fp8.Fp8Linear.from_linear(linear)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    assert fp8.scaled_gemm_ok(x.device, x.dtype)
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    values, scale = fp8.quantize_rows(x)
    weight = fp8.dequantize(layer.weight, layer.weight_scale.t())
    expected = fp8.dequantize(values, scale) @ weight.t() + (linear.bias.float() if bias else 0.0)
    error = float((got.float() - expected).norm() / expected.norm())
    assert error < 5e-3  # bf16 output rounding, fp32 accumulation order
    plain = x.float() @ linear.weight.float().t() + (linear.bias.float() if bias else 0.0)
    assert float((got.float() - plain).norm() / plain.norm()) < 0.06  # E4M3's rounding of both operands


def test_cuda_graphs_replay_a_quantized_model() -> None:
    from executor.model.config import Family, full_size
    from executor.model.cuda_graphs import GraphedModelRunner
    from executor.model.flashinfer_backend import make_backend
    from executor.model.forward import ModelRunner
    from executor.model.kv_cache import PagedKVCache
    from executor.model.loading import random_model
    from executor.model.microbatch import ForwardItem, Phase
    from sangam.hardware import pages_for
    from sangam.kv import PagePool

    pytest.importorskip("flashinfer")
    config = full_size(Family.DREAM)
    model = fp8.quantize_model(random_model(config, device="cuda", seed=0), "fp8")
    cache = PagedKVCache.for_model(PagePool(512), config, dtype=torch.bfloat16, device="cuda")
    runner = ModelRunner(model, cache, make_backend("cuda", config))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    items = []
    for rid in range(3):
        tokens = torch.cat([torch.randint(0, 1000, (300,), generator=g), torch.full((128,), config.mask_id)])
        cache.pool.allocate(rid, pages_for(len(tokens)))
        runner.forward([ForwardItem(rid, Phase.PREFILL, tokens, 300)])
        items.append(ForwardItem(rid, Phase.DECODE, tokens, 300))
    graphed = GraphedModelRunner(runner, buckets=(4,))
    assert graphed.captured
    replayed, eager = graphed.forward(items), runner.forward(items)
    assert replayed.isfinite().all()
    assert float((replayed.float() - eager.float()).norm() / eager.float().norm()) < 1e-2
    graphed.close()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fp8_stays_close_to_bf16_on_the_same_random_weights(family: str) -> None:
    pytest.importorskip("flashinfer")
    from benchmarks.fp8_accuracy import measure
    from executor.model.config import Family

    result = measure(Family(family), count=2, blocks=2, parts=("all",))
    for row in result.logits:
        assert row.relative_error < LOGITS_ERROR and row.top1_agreement > LOGITS_TOP1, row
    assert result.generation.forced_top1 > FORCED_TOP1, result.generation
