"""The seam between the simulator and the iteration-time models in `profiles/`, and per-kind scales of
iteration time (a testbed's fitted correction of its profile, or `sangam sim --time-scale`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sangam.batcher import Microbatch


class CostModel(Protocol):
    """Prices one worker iteration; the simulator waits this long before applying its progress."""

    def seconds(self, mb: Microbatch) -> float:
        """The wall time of one iteration of this microbatch on one worker."""
        ...


class IterationKind(StrEnum):
    """The kinds of iteration the measured model prices apart (profiles/measured.py)."""

    PREFILL = "prefill"  # prefills only
    DECODE = "decode"  # decodes only (replayed as CUDA graphs live)
    MIXED = "mixed"  # prefills with decodes riding along (the decodes in eager prefill attention)


def iteration_kind(mb: Microbatch) -> IterationKind:
    if mb.prefills:
        return IterationKind.MIXED if mb.decodes else IterationKind.PREFILL
    return IterationKind.DECODE


@dataclass(frozen=True, slots=True)
class TimeScales:
    """A multiplier of iteration time per `IterationKind`."""

    prefill: float = 1.0
    decode: float = 1.0
    mixed: float = 1.0

    def __post_init__(self) -> None:
        for kind in IterationKind:
            if not getattr(self, kind.value) > 0:
                raise ValueError(f"the {kind.value} time scale must be positive")

    def of(self, kind: IterationKind) -> float:
        scale: float = getattr(self, kind.value)
        return scale

    def times(self, factor: float) -> TimeScales:
        """Every kind's scale times `factor`."""
        return TimeScales(self.prefill * factor, self.decode * factor, self.mixed * factor)

    @property
    def identity(self) -> bool:
        return self.prefill == self.decode == self.mixed == 1.0

    def label(self) -> str:
        """`times 1.2` when every kind has the same scale, else each kind's."""
        if self.prefill == self.decode == self.mixed:
            return f"times {self.prefill:g}"
        return "times " + ", ".join(f"{self.of(k):g} {k.value}" for k in IterationKind)


@dataclass(frozen=True, slots=True)
class ScaledCostModel:
    """`base`'s time of every iteration times the scale of its kind."""

    base: CostModel
    scales: TimeScales

    def seconds(self, mb: Microbatch) -> float:
        return self.base.seconds(mb) * self.scales.of(iteration_kind(mb))


def scaled(cost: CostModel, scales: TimeScales) -> CostModel:
    """`cost` with `scales` applied (`cost` itself where every scale is 1)."""
    return cost if scales.identity else ScaledCostModel(cost, scales)


@dataclass(frozen=True, slots=True)
class LoopCosts:
    """Time a worker's loop spends on each iteration beyond the GPU call its profile prices (an executor's
    host-side structure, e.g. the reference implementation's: docs/calibration.md): `iteration_s` per
    iteration, `item_s` per item in it (host syncs and bookkeeping per request) and `token_s` per token of
    every item's sequence (a report that carries each request's full sequence, sent before the next
    iteration starts); items past `items_cap` (where given) add nothing more (the per-item cost was
    measured up to it)."""

    iteration_s: float = 0.0
    item_s: float = 0.0
    token_s: float = 0.0
    items_cap: int | None = None

    def __post_init__(self) -> None:
        if min(self.iteration_s, self.item_s, self.token_s) < 0:
            raise ValueError(f"loop costs must not be negative, got {self}")
        if self.items_cap is not None and self.items_cap < 1:
            raise ValueError(f"a loop's items cap must be at least 1, got {self.items_cap}")

    @property
    def none(self) -> bool:
        return self.iteration_s == self.item_s == self.token_s == 0.0

    def seconds(self, mb: Microbatch) -> float:
        tokens = 0
        for req in mb.decodes:
            tokens += req.seq_len
        for req in mb.prefills:
            tokens += req.seq_len
        items = len(mb.decodes) + len(mb.prefills)
        if self.items_cap is not None:
            items = min(items, self.items_cap)
        return self.iteration_s + self.item_s * items + self.token_s * tokens

    def label(self) -> str:
        ms, item, ns = self.iteration_s * 1e3, self.item_s * 1e3, self.token_s * 1e9
        cap = f" up to {self.items_cap}" if self.items_cap is not None else ""
        per_item = f"{item:.3g} ms per item{cap}"
        return f"plus a loop of {ms:.3g} ms + {per_item} + {ns:.3g} ns per token per iteration"


@dataclass(frozen=True, slots=True)
class LoopedCostModel:
    """`base`'s time of every iteration plus what the worker's loop adds to it."""

    base: CostModel
    loop: LoopCosts

    def seconds(self, mb: Microbatch) -> float:
        return self.base.seconds(mb) + self.loop.seconds(mb)


def looped(cost: CostModel, loop: LoopCosts) -> CostModel:
    """`cost` with the loop's costs added (`cost` itself where the loop adds nothing)."""
    return cost if loop.none else LoopedCostModel(cost, loop)
