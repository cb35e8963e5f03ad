"""FP8 against bf16 on the same weights: logits and committed tokens (issue 30, item 3).

Run on the accelerator machine, from the repository root (FlashInfer installed):

    python -m benchmarks.fp8_accuracy [--models llada dream] [--prompts 8] [--blocks 8] [--json FILE]

Per model, one set of seeded random bf16 weights (N(0, 0.02), as the speed benchmarks use) is run as it
is and quantized (`--quantization fp8`, also with only the attention projections or only the MLP
quantized), all on FlashInfer attention:

- logits: the block logits of a prefill (a 795-token prompt and 1,024 masks, the ShareGPT median) and of
  a decode step after it, as ||fp8 - bf16|| / ||bf16|| over the block, and the share of block positions
  whose argmax token agrees;
- generations: `--prompts` prompts each generate `--blocks` blocks of 32 tokens with threshold unmasking
  (0.9, greedy: the live default), all prompts in one microbatch, the mask buffer being the generated
  blocks. `free` runs each model on its own tokens and counts the generated positions where the two
  agree; `forced` runs the fp8 model on the bf16 run's states, forward by forward, and counts the
  forwards where it commits the same positions with the same tokens (one divergence does not carry).

With random weights these figures bound numerical error only: the logits are nearly flat, so a tiny
perturbation flips an argmax that a trained model would hold by a wide margin, and random weights are
never confident, so threshold unmasking commits one token (the most confident) per forward. A trained
checkpoint's accuracy (`--weights DIR`) needs task evaluations, not these.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from executor.model import fp8
from executor.model.attention import TorchAttention
from executor.model.config import Family, ModelConfig, full_size
from executor.model.flashinfer_backend import make_backend, warm_up_kernels
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.sampler import BlockStep, SamplingParams, unmask
from executor.model.transformer import Transformer
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool

PROMPT, MASKS = 795, 1024
PARTS = {"all": ("attn", "mlp"), "attention": ("attn",), "mlp": ("mlp",)}


@dataclass(frozen=True, slots=True)
class LogitsRow:
    model: str
    quantized: str  # all | attention | mlp | none-sdpa (bf16, torch attention: the noise floor)
    phase: str  # prefill | decode
    relative_error: float
    top1_agreement: float


@dataclass(frozen=True, slots=True)
class GenerationRow:
    model: str
    compared: str  # fp8 | bf16-sdpa (the noise floor: bf16 with torch attention instead of FlashInfer)
    prompts: int
    blocks: int
    forwards: int  # of the bf16 run
    free_agreement: float  # generated positions equal, each model on its own tokens
    forced_agreement: float  # forwards committing the same tokens at the same positions, on bf16's states
    forced_top1: float  # masked positions whose argmax token agrees, on bf16's states
    first_divergence: float  # mean generated position of the first difference (free runs), tokens


def quantize_part(model: Transformer, part: str) -> None:
    """Quantize the linear layers of `part` (all, attention, mlp) of `model`, in place."""
    for layer in model.layers:
        for name in PARTS[part]:
            block = layer.get_submodule(name)
            for attr, module in list(block.named_children()):
                if type(module) is nn.Linear:
                    setattr(block, attr, fp8.Fp8Linear.from_linear(module))


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm())


def top1_agreement(actual: Tensor, expected: Tensor) -> float:
    return float((actual.argmax(-1) == expected.argmax(-1)).float().mean())


class Runner:
    """One model over its own paged cache and FlashInfer attention (or torch's, `torch_attention`)."""

    def __init__(self, model: Transformer, pages: int, *, torch_attention: bool = False) -> None:
        config = model.config
        cache = PagedKVCache.for_model(PagePool(pages), config, dtype=model.dtype, device=model.device)
        backend = (
            TorchAttention() if torch_attention else make_backend(model.device, config, dtype=model.dtype)
        )
        self.runner = ModelRunner(model, cache, backend)
        self.pool = cache.pool
        self.mask_id = config.mask_id

    def fresh(self, ids: Sequence[int], lengths: Sequence[int]) -> None:
        for rid in list(ids):
            if self.pool.holds(rid):
                self.pool.release(rid)
        for rid, length in zip(ids, lengths, strict=True):
            self.pool.allocate(rid, pages_for(length))

    def forward(self, seqs: list[Tensor], starts: list[int], phase: Phase) -> Tensor:
        items = [ForwardItem(i, phase, s, b) for i, (s, b) in enumerate(zip(seqs, starts, strict=True))]
        return self.runner.forward(items)

    def step(self, seqs: list[Tensor], block: int, start: int, step: int, logits: Tensor) -> Tensor:
        """Commit one forward's tokens into `seqs` (in place); the new blocks (N, 32) on the host."""
        blocks = torch.stack([s[start : start + BLOCK] for s in seqs])
        steps = [BlockStep(SamplingParams(threshold=0.9), block, step)] * len(seqs)
        new = unmask(blocks, logits, steps, self.mask_id).tokens.cpu()
        for s, row in zip(seqs, new, strict=True):
            s[start : start + BLOCK] = row
        return new


def prompts(config_vocab_end: int, count: int, length: int, seed: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, config_vocab_end, (length,), generator=g) for _ in range(count)]


def generate(
    runner: Runner, heads: list[Tensor], blocks: int, follow: Runner | None = None
) -> tuple[list[Tensor], int, list[float], list[float]]:
    """Threshold generations of `blocks` blocks from prompts `heads`, all in one microbatch: the final
    sequences, the forwards taken and, with `follow` run on the same states, per forward the share of
    items it commits exactly the same tokens for and the share of masked positions whose argmax agrees."""
    mask = runner.mask_id
    seqs = [torch.cat([h, torch.full((blocks * BLOCK,), mask)]) for h in heads]
    ids, lengths = range(len(seqs)), [len(s) for s in seqs]
    runner.fresh(ids, lengths)
    if follow is not None:
        follow.fresh(ids, lengths)
    forwards, same, top1 = 0, [], []
    for block in range(blocks):
        start = len(heads[0]) + block * BLOCK
        step = 0
        while any(bool((s[start : start + BLOCK] == mask).any()) for s in seqs):
            phase = Phase.PREFILL if step == 0 else Phase.DECODE
            before = [s.clone() for s in seqs]
            logits = runner.forward(seqs, [start] * len(seqs), phase)
            new = runner.step(seqs, block, start, step, logits)
            if follow is not None:
                theirs = follow.forward(before, [start] * len(seqs), phase)
                masked = torch.stack([b[start : start + BLOCK] for b in before]).to(logits.device) == mask
                other = follow.step(before, block, start, step, theirs)
                same.append(float((other == new).all(-1).float().mean()))
                agree = theirs.argmax(-1) == logits.argmax(-1)
                top1.append(float(agree[masked].float().mean()))
            forwards += 1
            step += 1
    return seqs, forwards, same, top1


def logits_rows(
    family: Family, reference: Runner, quantized: Runner, part: str, prompt: int, masks: int
) -> list[LogitsRow]:
    config = reference.runner.model.config
    seqs = [torch.cat([p, torch.full((masks,), config.mask_id)]) for p in prompts(200, 4, prompt, seed=7)]
    rows = []
    for runner in (reference, quantized):
        runner.fresh(range(len(seqs)), [len(s) for s in seqs])
    for phase in (Phase.PREFILL, Phase.DECODE):  # the decode re-reads the KV its own prefill wrote
        expected, got = (r.forward(seqs, [prompt] * len(seqs), phase) for r in (reference, quantized))
        error, agree = relative_error(got, expected), top1_agreement(got, expected)
        rows.append(LogitsRow(family.value, part, phase.value, error, agree))
    return rows


@dataclass(frozen=True, slots=True)
class Accuracy:
    logits: list[LogitsRow]
    generation: GenerationRow
    floor: GenerationRow  # bf16 against bf16 with torch attention: what a bf16-sized perturbation does
    seconds: float  # the generations'


def measure(
    family: Family,
    count: int,
    blocks: int,
    parts: Sequence[str] = tuple(PARTS),
    *,
    config: ModelConfig | None = None,
    device: str = "cuda",
    prompt: int = PROMPT,
    masks: int = MASKS,
) -> Accuracy:
    """Logit rows for each quantized part and the generation row of the whole quantization, for the
    full-size model of `family` in bf16 (or `config` in fp32 on the CPU: tests)."""
    config = config or full_size(family)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    pages = 4 * pages_for(prompt + masks) + count * pages_for(prompt + blocks * BLOCK) + 16

    def build() -> Transformer:
        return random_model(config, dtype=dtype, device=device, seed=0)

    reference = Runner(build(), pages)
    logits: list[LogitsRow] = []
    whole = None  # the model quantized throughout, kept for the generations
    for part in parts:
        model = build()
        quantize_part(model, part)
        runner = Runner(model, pages)
        logits += logits_rows(family, reference, runner, part, prompt, masks)
        if part == "all":
            whole = runner
        del model, runner
        if device == "cuda":
            torch.cuda.empty_cache()
    if whole is None:
        model = build()
        quantize_part(model, "all")
        whole = Runner(model, pages)
    floor = Runner(reference.runner.model, pages, torch_attention=True)
    logits += logits_rows(family, reference, floor, "none-sdpa", prompt, masks)
    heads = prompts(200, count, prompt, seed=11)
    started = time.perf_counter()
    generation = compare(family.value, "fp8", reference, whole, heads, blocks)
    floor_row = compare(family.value, "bf16-sdpa", reference, floor, heads, blocks)
    return Accuracy(logits, generation, floor_row, time.perf_counter() - started)


def compare(
    model: str, label: str, reference: Runner, other: Runner, heads: list[Tensor], blocks: int
) -> GenerationRow:
    """`other`'s threshold generations against `reference`'s, free-running and on its states."""
    ref_seqs, forwards, same, top1 = generate(reference, heads, blocks, follow=other)
    other_seqs, *_ = generate(other, heads, blocks)
    generated = slice(len(heads[0]), len(heads[0]) + blocks * BLOCK)
    equal = torch.stack([a[generated] == b[generated] for a, b in zip(ref_seqs, other_seqs, strict=True)])
    first = [int((~row).float().argmax()) if not row.all() else blocks * BLOCK for row in equal]
    return GenerationRow(
        model, label, len(heads), blocks, forwards, float(equal.float().mean()), sum(same) / len(same),
        sum(top1) / len(top1), sum(first) / len(first),
    )  # fmt: skip


def print_result(result: Accuracy) -> None:
    for row in result.logits:
        print(
            f"{row.model:<6} fp8 {row.quantized:<9} {row.phase:<7} logits rel. error "
            f"{row.relative_error:.4f}  top-1 agreement {row.top1_agreement:.3f}"
        )
    for g in (result.generation, result.floor):
        print(
            f"{g.model:<6} {g.compared:<9} generations {g.prompts} x {g.blocks} blocks ({g.forwards} "
            f"forwards): tokens agree {g.free_agreement:.3f} free-running (first difference at token "
            f"{g.first_divergence:.0f} on average); on bf16's states forwards commit alike "
            f"{g.forced_agreement:.3f}, argmax tokens agree {g.forced_top1:.3f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="+", choices=[f.value for f in Family], default=[f.value for f in Family]
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument(
        "--exact-accum", action="store_true", help="FP8 GEMMs without fast accumulation (the default has it)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fp8_accuracy needs a CUDA GPU")
    fp8.FAST_ACCUM = not args.exact_accum
    warm_up_kernels("cuda")
    results = {}
    for name in args.models:
        results[name] = measure(Family(name), args.prompts, args.blocks)
        torch.cuda.empty_cache()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, random weights N(0, 0.02), seed 0")
    for result in results.values():
        print_result(result)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({name: asdict(result) for name, result in results.items()}, handle, indent=1)


if __name__ == "__main__":
    main()
