"""Our model's logits in bf16 on a device against float32 on the CPU, on a small checkpoint of each family
in its repository's layout (issue 28 item 7).

    python -m benchmarks.checkpoint_logits [--device cuda] [--json FILE]

Per family, `benchmarks.checkpoint_layouts` writes a checkpoint (2 layers, 4 query heads of 128, the full
models' head size, so that a GPU runs the attention kernels it serves with; the real vocabulary; bf16 weights
N(0, 0.02), LLaDA's `init_std`) and the worker's loader (`load_checkpoint`) reads it twice: in float32 on the
CPU (the reference, torch attention) and in bf16 on `--device` (on CUDA FlashInfer attention and its fused
norm, activation and KV-store kernels, as served). The weights are bf16 in the files, so both models hold the
same values and what differs is the arithmetic's precision alone. The same microbatch goes through both over a
paged KV cache: a prefill of four sequences (prompts of 45 to 200 tokens, then 64 masks; the first block),
then a decode of that block with every other position committed (the reference's argmax). Per phase: the
largest absolute difference of the block logits, that over the reference's largest |logit|, ||bf16 - fp32|| /
||fp32||, and the share of block positions whose argmax agrees.

Without a GPU (`--device cpu`) the bf16 side is the torch path in bf16 on the CPU: how the script is tried on
a CPU machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from benchmarks.checkpoint_layouts import dream_checkpoint, llada_checkpoint, tiny_real
from executor.model.config import Family
from executor.model.flashinfer_backend import make_backend
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import load_checkpoint
from executor.model.microbatch import ForwardItem, Phase
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool

PROMPTS, MASKS = (45, 77, 128, 200), 64
HEAD_DIM = 128  # LLaDA-8B's and Dream-7B's
STD = 0.02  # weights N(0, STD): LLaDA's init_std (0.5, the tests' choice, saturates attention)
FACTORIES = {Family.LLADA: llada_checkpoint, Family.DREAM: dream_checkpoint}


@dataclass(frozen=True, slots=True)
class LogitsRow:
    family: str
    phase: str  # prefill | decode
    positions: int  # block positions compared
    max_abs_error: float
    max_abs_reference: float
    relative_max_error: float  # max_abs_error / max_abs_reference
    relative_error: float  # ||bf16 - fp32|| / ||fp32||
    argmax_agreement: float  # share of positions whose argmax token is the same


class Side:
    """One model loaded from the checkpoint, over its own paged KV cache holding the sequences' pages."""

    def __init__(self, directory: Path, dtype: torch.dtype, device: str, lengths: Sequence[int]) -> None:
        model = load_checkpoint(directory, dtype=dtype, device=device)
        pool = PagePool(sum(pages_for(length) for length in lengths))
        cache = PagedKVCache.for_model(pool, model.config, dtype=dtype, device=device)
        for request_id, length in enumerate(lengths):
            pool.allocate(request_id, pages_for(length))
        self.runner = ModelRunner(model, cache, make_backend(device, model.config, dtype=dtype))

    def forward(self, sequences: Sequence[Tensor], starts: Sequence[int], phase: Phase) -> Tensor:
        """Block logits (items, 32, vocab), float32 on the CPU."""
        pairs = enumerate(zip(sequences, starts, strict=True))
        items = [ForwardItem(i, phase, tokens, start) for i, (tokens, start) in pairs]
        return self.runner.forward(items).float().cpu()


def compare(family: Family, phase: Phase, got: Tensor, expected: Tensor) -> LogitsRow:
    error = (got - expected).abs().max().item()
    reference = expected.abs().max().item()
    return LogitsRow(
        family=family.value,
        phase=phase.value,
        positions=expected.shape[0] * expected.shape[1],
        max_abs_error=error,
        max_abs_reference=reference,
        relative_max_error=error / reference,
        relative_error=((got - expected).norm() / expected.norm()).item(),
        argmax_agreement=(got.argmax(-1) == expected.argmax(-1)).float().mean().item(),
    )


def measure(
    family: Family, device: str, directory: Path, seed: int = 0, prompts: Sequence[int] = PROMPTS
) -> list[LogitsRow]:
    """Prefill and decode rows of `family`'s small checkpoint written under `directory`, over sequences of
    `prompts` tokens and `MASKS` masks."""
    config = tiny_real(family, head_dim=HEAD_DIM)
    FACTORIES[family](directory, config, seed=seed, std=STD)
    generator = torch.Generator().manual_seed(seed)
    heads = [torch.randint(0, 256, (length,), generator=generator) for length in prompts]
    sequences = [torch.cat([p, torch.full((MASKS,), config.mask_id)]) for p in heads]
    starts = list(prompts)
    lengths = [len(s) for s in sequences]
    reference = Side(directory, torch.float32, "cpu", lengths)
    tested = Side(directory, torch.bfloat16, device, lengths)
    rows = []
    expected = reference.forward(sequences, starts, Phase.PREFILL)
    rows.append(compare(family, Phase.PREFILL, tested.forward(sequences, starts, Phase.PREFILL), expected))
    committed = [s.clone() for s in sequences]
    for tokens, start, logits in zip(committed, starts, expected, strict=True):
        every_other = torch.arange(0, BLOCK, 2)
        tokens[start + every_other] = logits[every_other].argmax(-1)
    expected = reference.forward(committed, starts, Phase.DECODE)
    rows.append(compare(family, Phase.DECODE, tested.forward(committed, starts, Phase.DECODE), expected))
    return rows


def print_rows(rows: Sequence[LogitsRow], device: str) -> None:
    where = torch.cuda.get_device_name() if device.startswith("cuda") else device
    print(
        f"# bf16 on {device} ({where}) against float32 on the CPU; 2 layers, head_dim {HEAD_DIM}, the real "
        f"vocabularies; torch {torch.__version__}"
    )
    print(
        f"{'family':<7}{'phase':<9}{'positions':>10}{'max|d|':>11}{'max|ref|':>11}{'max|d|/max|ref|':>17}"
        f"{'||d||/||ref||':>15}{'argmax agree':>14}"
    )
    for r in rows:
        print(
            f"{r.family:<7}{r.phase:<9}{r.positions:>10}{r.max_abs_error:>11.4g}{r.max_abs_reference:>11.4g}"
            f"{r.relative_max_error:>17.3e}{r.relative_error:>15.3e}{r.argmax_agreement:>14.3f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="where the bf16 side runs (cuda or cpu)")
    parser.add_argument(
        "--families", nargs="+", choices=[f.value for f in Family], default=[f.value for f in Family]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU (--device cpu compares bf16 on the CPU)")
    rows: list[LogitsRow] = []
    with tempfile.TemporaryDirectory(prefix="checkpoint-logits-") as scratch:
        for name in args.families:
            rows += measure(Family(name), args.device, Path(scratch) / name, args.seed)
    print_rows(rows, args.device)
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
