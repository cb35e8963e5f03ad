"""A what-if on iteration times: another cost model's every iteration, scaled."""

from __future__ import annotations

from dataclasses import dataclass

from sangam.batcher import Microbatch
from sangam.cost import CostModel


@dataclass(frozen=True, slots=True)
class ScaledCostModel:
    """`base`'s time of every iteration times `scale` (`sangam sim --time-scale`)."""

    base: CostModel
    scale: float

    def seconds(self, mb: Microbatch) -> float:
        return self.base.seconds(mb) * self.scale
