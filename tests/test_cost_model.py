"""The analytic cost model against the H200 layer measurements, and the orderings a simulator relies on."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count, pairwise

import pytest

from profiles.analytic import ITERATION_OVERHEAD_S, AnalyticCostModel
from sangam.batcher import Microbatch
from sangam.cost import CostModel
from sangam.hardware import BLOCK, GPUS, MODELS
from sangam.request import Request

_ids = count()


def request(seq_len: int) -> Request:
    """A one-block request whose prefill runs over, and whose decodes attend to, `seq_len` tokens."""
    return Request(id=next(_ids), arrival=0.0, prompt_len=seq_len, output_len=BLOCK, mask_len=0, steps=(1,))


def microbatch(prefill_lens: Sequence[int] = (), decode_contexts: Sequence[int] = ()) -> Microbatch:
    return Microbatch(
        decodes=tuple(request(s) for s in decode_contexts),
        prefills=tuple(request(s) for s in prefill_lens),
        waiting=0,
        deficit_before=0,
        budget=0,
        deficit_after=0,
    )


def cost(model: str = "llada-8b", gpu: str = "h200") -> AnalyticCostModel:
    return AnalyticCostModel(MODELS[model], GPUS[gpu])


def test_is_a_cost_model() -> None:
    model: CostModel = cost()
    assert model.seconds(microbatch(decode_contexts=[1824])) > 0


# docs/design.md section 5: one LLaDA-8B layer on the H200, in seconds.
@pytest.mark.parametrize(
    ("prefill_lens", "decode_contexts", "measured"),
    [
        ([2048], [], 1.38e-3),
        ([8192], [], 7.3e-3),
        ([], [1824], 0.18e-3),
        ([], [1824] * 8, 0.28e-3),
        ([], [1824] * 64, 1.95e-3),
    ],
    ids=["prefill-2048", "prefill-8192", "decode-b1", "decode-b8", "decode-b64"],
)
def test_llada_layer_matches_h200_measurement(
    prefill_lens: list[int], decode_contexts: list[int], measured: float
) -> None:
    predicted = cost().layer_seconds(prefill_lens, decode_contexts)
    assert abs(predicted / measured - 1) < 0.15


def test_seconds_is_layers_plus_head_and_overhead() -> None:
    model = cost()
    layer = model.layer_seconds([2048], [1824] * 4)
    total = model.seconds(microbatch([2048], [1824] * 4))
    assert total > MODELS["llada-8b"].layers * layer + ITERATION_OVERHEAD_S


def test_empty_microbatch_costs_only_the_fixed_overhead() -> None:
    assert cost().seconds(microbatch()) == ITERATION_OVERHEAD_S


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("gpu", list(GPUS))
def test_more_decodes_never_cheaper(name: str, gpu: str) -> None:
    model = cost(name, gpu)
    for prefills in ([], [1819]):
        times = [model.seconds(microbatch(prefills, [1819] * n)) for n in range(65)]
        assert all(a <= b for a, b in pairwise(times))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("gpu", list(GPUS))
def test_longer_sequences_never_cheaper(name: str, gpu: str) -> None:
    model = cost(name, gpu)
    lengths = range(32, 8193, 32)
    prefills = [model.seconds(microbatch([s], [1819] * 4)) for s in lengths]
    decodes = [model.seconds(microbatch([], [s] * 8)) for s in lengths]
    for times in (prefills, decodes):
        assert all(a <= b for a, b in pairwise(times))


def test_adding_a_prefill_never_cheaper() -> None:
    model = cost()
    for n in range(5):
        assert model.seconds(microbatch([1024] * n, [1819] * 8)) <= model.seconds(
            microbatch([1024] * (n + 1), [1819] * 8)
        )


@pytest.mark.parametrize("name", list(MODELS))
def test_h100_slower_on_memory_bound_decode(name: str) -> None:
    mb = microbatch([], [1819])
    assert cost(name, "h100").seconds(mb) > 1.1 * cost(name, "h200").seconds(mb)


@pytest.mark.parametrize("name", list(MODELS))
def test_h100_matches_h200_on_compute_bound_prefill(name: str) -> None:
    mb = microbatch([8192])
    assert cost(name, "h100").seconds(mb) == pytest.approx(cost(name, "h200").seconds(mb), rel=0.01)


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_dream_decode_at_long_context_cheaper_than_llada(batch: int) -> None:
    contexts = [4096] * batch
    dream, llada = cost("dream-7b"), cost("llada-8b")
    assert dream.seconds(microbatch([], contexts)) < llada.seconds(microbatch([], contexts))
    # GQA: the per-layer attention that grows with the context is several times cheaper
    dream_attention = dream.layer_seconds([], contexts) - dream.layer_seconds([], [0] * batch)
    llada_attention = llada.layer_seconds([], contexts) - llada.layer_seconds([], [0] * batch)
    assert dream_attention < llada_attention / 2


def test_time_scales_multiply_each_iteration_by_its_kinds_scale() -> None:
    from sangam.cost import IterationKind, ScaledCostModel, TimeScales, iteration_kind, scaled

    base = cost()
    scales = TimeScales(prefill=2.0, decode=3.0, mixed=5.0)
    model = ScaledCostModel(base, scales)
    for mb, kind in (
        (microbatch(prefill_lens=[1024]), IterationKind.PREFILL),
        (microbatch(decode_contexts=[1024, 2048]), IterationKind.DECODE),
        (microbatch(prefill_lens=[512], decode_contexts=[1024]), IterationKind.MIXED),
    ):
        assert iteration_kind(mb) == kind
        assert model.seconds(mb) == pytest.approx(base.seconds(mb) * scales.of(kind))
    assert scaled(base, TimeScales()) is base
    assert scales.times(2) == TimeScales(4.0, 6.0, 10.0)
    with pytest.raises(ValueError, match="positive"):
        TimeScales(decode=0)
