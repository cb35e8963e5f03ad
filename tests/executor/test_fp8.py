"""FP8 quantization (`--quantization fp8`) on CPU: the quantize / dequantize math against float64, the
reference GEMM path, the quantized model, and the flag on every command that builds a model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from executor.model import fp8
from executor.model.attention import TorchAttention
from executor.model.config import Family, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.layers import RMSNorm
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.run import live_options
from executor.worker.engine import build_model
from sangam.hardware import pages_for
from sangam.kv import PagePool

E4M3_STEP = 2.0**-4  # half the gap between normal E4M3 values, relative: 3 mantissa bits
E4M3_TINY = 2.0**-10  # half the smallest subnormal (2**-9), absolute, in units of the scale


def rows(m: int, k: int, seed: int, spread: float = 3.0) -> Tensor:
    """Rows of very different magnitudes, with outliers, so per-row scales matter."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    x *= torch.logspace(-spread, spread, m, dtype=torch.float64)[:, None]
    x[:, 0] *= 20.0  # an outlier channel
    return x


def test_scales_are_each_rows_amax_over_448_with_a_floor() -> None:
    x = rows(16, 96, seed=0)
    x[5] = 0.0
    scale = fp8.scales(x.float())
    assert scale.shape == (16, 1) and scale.dtype == torch.float32
    expected = x.abs().amax(-1, keepdim=True) / 448.0
    expected[5] = fp8.MIN_SCALE
    torch.testing.assert_close(scale.double(), expected, rtol=1e-6, atol=0.0)


def test_values_beyond_448_saturate_instead_of_becoming_nan() -> None:
    x = torch.tensor([[-1e6, -449.0, -448.0, 0.0, 447.0, 460.0, 1e30]])
    q = fp8.to_fp8(x, torch.ones(1, 1))
    assert q.float().tolist() == [[-448.0, -448.0, -448.0, 0.0, 448.0, 448.0, 448.0]]
    assert not q.float().isnan().any()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_round_trip_error_is_within_e4m3_rounding_of_float64(seed: int) -> None:
    x = rows(64, 256, seed=seed)
    values, scale = fp8.quantize_rows(x.float())
    assert values.dtype == fp8.FP8 and scale.shape == (64, 1)
    back = values.double() * scale.double()
    bound = torch.maximum(E4M3_STEP * x.abs(), E4M3_TINY * scale.double()) * (1 + 1e-6)
    assert ((back - x).abs() <= bound).all()
    # every row reaches E4M3's largest value at its amax: no range is wasted
    assert (values.float().abs().amax(-1) == 448.0).all()
    # and the bulk error is the rounding's, not the bound's
    assert float((back - x).norm() / x.norm()) < 0.03


def test_weights_get_one_scale_per_output_channel() -> None:
    w = rows(48, 64, seed=4).float().t().contiguous().t()  # any layout
    values, scale = fp8.quantize_weight(w)
    assert values.shape == (48, 64) and scale.shape == (48,)
    torch.testing.assert_close(scale, w.abs().amax(1) / 448.0)
    back = fp8.dequantize(values, scale[:, None], torch.float64)
    bound = torch.maximum(E4M3_STEP * w.double().abs(), E4M3_TINY * scale.double()[:, None]) * (1 + 1e-6)
    assert ((back - w.double()).abs() <= bound).all()


def linear(k: int, n: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(k, n, bias=bias)
    if bias:  # large, as Qwen2's q/k biases: they must not go through the quantization
        nn.init.normal_(layer.bias, 0.0, 5.0)
    return layer.requires_grad_(False)


@pytest.mark.parametrize("bias", [False, True])
def test_the_reference_gemm_is_the_scaled_product_of_the_quantized_operands(bias: bool) -> None:
    layer = linear(128, 96, bias, seed=5)
    quantized = fp8.Fp8Linear.from_linear(layer)
    x = rows(40, 128, seed=6, spread=2.0)
    out = quantized(x.float())
    assert out.dtype == torch.float32 and out.shape == (40, 96)
    # float64 of the very same quantized values and scales: only the float32 summation differs
    xq, sx = fp8.quantize_rows(x.float())
    wq, sw = fp8.quantize_weight(layer.weight)
    exact = (xq.double() * sx.double()) @ (wq.double() * sw.double()[:, None]).t()
    if bias:
        exact += layer.bias.double()
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))
    # against the unquantized float64 product: E4M3's rounding of both operands, averaged over K
    plain = x @ layer.weight.double().t() + (layer.bias.double() if bias else 0.0)
    relative = float((out.double() - plain).norm() / (plain - (layer.bias.double() if bias else 0.0)).norm())
    assert relative < 0.05


def test_the_bias_is_added_after_the_gemm_unquantized() -> None:
    layer = linear(64, 32, True, seed=7)
    quantized = fp8.Fp8Linear.from_linear(layer)
    assert quantized.bias is not None and quantized.bias.dtype == torch.float32
    torch.testing.assert_close(quantized.bias, layer.bias)  # the bias keeps every bit
    x = rows(8, 64, seed=8, spread=0.5).float()
    without = fp8.Fp8Linear(quantized.weight, quantized.weight_scale.flatten(), None)
    torch.testing.assert_close(quantized(x) - without(x), layer.bias.expand(8, -1), rtol=0, atol=1e-5)


def test_silu_mul_then_quantize_matches_the_two_steps() -> None:
    layer = fp8.Fp8Linear.from_linear(linear(64, 32, False, seed=9))
    gate_up = rows(12, 128, seed=10, spread=1.0).float()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(layer.forward_silu_mul(gate_up), layer(F.silu(gate) * up))


@pytest.mark.parametrize("add", [False, True])
def test_a_norm_before_an_fp8_layer_hands_it_rows_it_would_have_quantized_itself(add: bool) -> None:
    norm = RMSNorm(64, eps=1e-5)
    norm.weight.data = torch.rand(64, generator=torch.Generator().manual_seed(12)) + 0.5
    layer = fp8.Fp8Linear.from_linear(linear(64, 16, True, seed=13))
    x, residual = rows(10, 64, seed=14, spread=1.0).float(), rows(10, 64, seed=15, spread=1.0).float()
    quantized, stream = norm.add_norm_quantized(x if add else None, residual.clone())
    normed, expected_stream = norm.add_norm(x, residual) if add else (norm(residual), residual)
    assert isinstance(quantized, fp8.Fp8Rows) and quantized.dtype == torch.float32
    torch.testing.assert_close(stream, expected_stream, rtol=0, atol=0)
    values, scale = fp8.quantize_rows(normed)
    assert torch.equal(quantized.values.float(), values.float()) and torch.equal(quantized.scale, scale)
    torch.testing.assert_close(layer(quantized), layer(normed), rtol=0, atol=0)


def test_a_quantized_layer_norms_into_fp8_rows_and_a_plain_one_into_a_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tiny(Family.LLADA)
    model = fp8.quantize_model(random_model(config, dtype=torch.float32, device="cpu", seed=16), "fp8")
    seen: list[type] = []
    original = fp8.Fp8Linear.forward

    def spy(self: fp8.Fp8Linear, x: Any) -> Tensor:
        seen.append(type(x))
        return original(self, x)

    monkeypatch.setattr(fp8.Fp8Linear, "forward", spy)
    logits(model, seed=17)
    layers = config.shape.layers
    assert seen.count(fp8.Fp8Rows) == 2 * layers  # q/k/v and gate/up, each fed by its norm
    assert seen.count(Tensor) == layers  # the attention's output projection quantizes its own input


def test_shapes_beyond_two_dimensions_pass_through() -> None:
    layer = fp8.Fp8Linear.from_linear(linear(32, 16, True, seed=11))
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(layer(x), layer(x.reshape(15, 32)).reshape(3, 5, 16))


def test_a_non_fp8_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="E4M3"):
        fp8.Fp8Linear(torch.zeros(4, 4), torch.ones(4), None)


def logits(model: nn.Module, seed: int) -> Tensor:
    config = model.config  # type: ignore[attr-defined]
    cache = PagedKVCache.for_model(PagePool(16), config, dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.cat([torch.randint(0, 200, (40,), generator=g), torch.full((64,), config.mask_id)])
    cache.pool.allocate(0, pages_for(len(tokens)))
    runner = ModelRunner(model, cache, TorchAttention())  # type: ignore[arg-type]
    return runner.forward([ForwardItem(0, Phase.PREFILL, tokens, 40)])


@pytest.mark.parametrize("family", list(Family))
def test_a_quantized_model_keeps_head_norms_and_embeddings_and_stays_close(family: Family) -> None:
    model = random_model(tiny(family), dtype=torch.float32, seed=2, std=0.05)
    expected = logits(model, seed=3)
    fp8.quantize_model(model, "fp8")
    quantized = [name for name, m in model.named_modules() if isinstance(m, fp8.Fp8Linear)]
    assert len(quantized) == 4 * model.config.shape.layers  # qkv, out, gate_up, down of every layer
    assert not any(type(m) is nn.Linear for m in model.layers.modules())
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.float32
    if family is Family.DREAM:
        assert model.layers[0].attn.qkv.bias is not None
    got = logits(model, seed=3)
    relative = float((got - expected).norm() / expected.norm())
    assert 0.0 < relative < 0.1  # 0.06 here: K = 64 averages E4M3's rounding over few terms


def test_build_model_quantizes_on_cpu_and_refuses_unknown_methods() -> None:
    device = torch.device("cpu")
    plain = build_model("tiny-dream", "random", device, seed=1)
    model = build_model("tiny-dream", "random", device, seed=1, quantization="fp8")
    assert isinstance(model.layers[1].mlp.down, fp8.Fp8Linear)
    assert fp8.weight_bytes(model) < fp8.weight_bytes(plain)
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        build_model("tiny-dream", "random", device, seed=1, quantization="int4")


def test_the_flag_is_declared_once_and_reaches_live_serve_and_profile() -> None:
    from cli.main import UsageError, build_parser
    from executor.run.live_options import LiveOptions
    from runs.options import collect

    assert live_options.QUANTIZATIONS == fp8.QUANTIZATIONS
    parser = build_parser()
    for command in (["live"], ["serve"], ["profile"]):
        assert collect(LiveOptions, parser.parse_args(command)).quantization is None
        given = parser.parse_args([*command, "--quantization", "fp8"])
        assert collect(LiveOptions, given).quantization == "fp8"
    with pytest.raises(UsageError, match="invalid choice: 'int8'"):
        parser.parse_args(["live", "--quantization", "int8"])


def test_plan_run_hands_the_quantization_to_the_workers() -> None:
    from executor.run.live import plan_run
    from executor.run.live_options import LiveOptions
    from runs.config import RunConfig

    plan = plan_run(RunConfig(), LiveOptions(workers=1, quantization="fp8"))
    assert plan.cluster.quantization == "fp8"


def test_the_accuracy_harness_compares_like_with_like_on_cpu() -> None:
    from benchmarks.fp8_accuracy import generate, measure, quantize_part

    result = measure(Family.DREAM, 2, 1, config=tiny(Family.DREAM), device="cpu", prompt=40, masks=64)
    parts = {(row.quantized, row.phase) for row in result.logits}
    names = ("all", "attention", "mlp", "none-sdpa")
    assert parts == {(q, p) for q in names for p in ("prefill", "decode")}
    assert all(0.0 < row.relative_error < 0.1 for row in result.logits if row.quantized != "none-sdpa")
    # on CPU the reference runs torch attention too: the noise floor is exactly none
    assert all(row.relative_error == 0.0 for row in result.logits if row.quantized == "none-sdpa")
    assert result.floor.forced_top1 == 1.0 and result.floor.free_agreement == 1.0
    g = result.generation
    assert g.forwards == 32 and 0.0 <= g.free_agreement <= 1.0 and 0.0 <= g.forced_top1 <= 1.0
    # a model followed by itself agrees everywhere
    from benchmarks.fp8_accuracy import Runner, prompts

    config = tiny(Family.LLADA)
    model = random_model(config, dtype=torch.float32, seed=0)
    runner = Runner(model, 64)
    _, forwards, same, top1 = generate(runner, prompts(200, 2, 40, seed=1), 1, follow=runner)
    assert forwards == 32 and set(same) == {1.0} and set(top1) == {1.0}
    quantize_part(model, "mlp")
    assert isinstance(model.layers[0].mlp.down, fp8.Fp8Linear)
    assert type(model.layers[0].attn.qkv) is nn.Linear


def test_bf16_activations_on_an_fp8_gpu_take_the_scaled_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path's dispatch, on CPU: `torch._scaled_mm` gets the quantized rows, the transposed weight
    and both row-wise scales, and the bias is added after it; it computes what the reference path does."""
    calls = []

    def scaled_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, **kwargs: Any) -> Tensor:
        calls.append((a.dtype, b.shape, scale_a.shape, scale_b.shape, kwargs["out_dtype"]))
        return ((a.float() * scale_a) @ (b.float() * scale_b)).to(kwargs["out_dtype"])

    layer = fp8.Fp8Linear.from_linear(linear(64, 32, True, seed=12).to(torch.bfloat16))
    x = torch.randn(5, 64).to(torch.bfloat16)
    reference = layer(x)
    monkeypatch.setattr(fp8, "scaled_gemm_ok", lambda device, dtype: dtype == torch.bfloat16)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    out = layer(x)
    assert calls == [(fp8.FP8, (64, 32), (5, 1), (1, 32), torch.bfloat16)]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)
