"""Print the analytic cost model's figures: one LLaDA-8B layer against docs/design.md section 5, then whole
iterations of both models on both GPUs.

Run from the repository root: `python -m benchmarks.cost_model_figures`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

from profiles.analytic import AnalyticCostModel
from sangam.batcher import Microbatch
from sangam.hardware import BLOCK, GPUS, MODELS
from sangam.request import Request

CONTEXT = 795 + 1024  # ShareGPT median prompt plus the mask buffer
PREFILL_LENS = (1024, 2048, 4096)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)

# (label, prefill lengths, decode contexts, measured seconds): docs/design.md section 5, one H200.
LAYER_MEASUREMENTS: tuple[tuple[str, tuple[int, ...], tuple[int, ...], float], ...] = (
    ("prefill 2048", (2048,), (), 1.38e-3),
    ("prefill 8192", (8192,), (), 7.3e-3),
    ("decode b1 @1824", (), (1824,), 0.18e-3),
    ("decode b8 @1824", (), (1824,) * 8, 0.28e-3),
    ("decode b64 @1824", (), (1824,) * 64, 1.95e-3),
)

_ids = count()


def microbatch(prefill_lens: Sequence[int], decode_contexts: Sequence[int]) -> Microbatch:
    def request(seq_len: int) -> Request:
        return Request(next(_ids), 0.0, seq_len, BLOCK, 0, (1,))

    decodes = tuple(request(s) for s in decode_contexts)
    prefills = tuple(request(s) for s in prefill_lens)
    return Microbatch(decodes, prefills, waiting=0, deficit_before=0, budget=0, deficit_after=0)


def layer_table() -> None:
    model = AnalyticCostModel(MODELS["llada-8b"], GPUS["h200"])
    print("One LLaDA-8B layer on the H200 (ms)")
    print(f"{'workload':<18}{'measured':>10}{'model':>10}{'error':>9}")
    for label, prefills, decodes, measured in LAYER_MEASUREMENTS:
        predicted = model.layer_seconds(prefills, decodes)
        error = 100 * (predicted / measured - 1)
        print(f"{label:<18}{measured * 1e3:>10.3f}{predicted * 1e3:>10.3f}{error:>+8.1f}%")


def iteration_table() -> None:
    models = {
        f"{m}/{g}": AnalyticCostModel(MODELS[m], GPUS[g]) for m in ("llada-8b", "dream-7b") for g in GPUS
    }
    workloads: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    workloads = [(f"prefill {s}", (s,), ()) for s in PREFILL_LENS]
    workloads += [(f"decode b{b} @{CONTEXT}", (), (CONTEXT,) * b) for b in DECODE_BATCHES]
    print("\nWhole iterations, layers + LM head + fixed overhead (ms)")
    print(f"{'workload':<18}" + "".join(f"{name:>16}" for name in models))
    for label, prefills, decodes in workloads:
        mb = microbatch(prefills, decodes)
        print(f"{label:<18}" + "".join(f"{m.seconds(mb) * 1e3:>16.2f}" for m in models.values()))


if __name__ == "__main__":
    layer_table()
    iteration_table()
