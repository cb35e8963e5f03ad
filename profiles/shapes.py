"""An iteration's shape: what its time depends on, from a microbatch, a profile row or a live log.

Items are written `p:S:S` (a prefill over S tokens) and `d:32:C` (a block decode against C cached
positions), joined by `;`: the `items` column of profile data and of live iteration logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sangam.batcher import Microbatch
from sangam.hardware import BLOCK


@dataclass(frozen=True, slots=True)
class Shape:
    prefills: tuple[int, ...]  # S of each prefill
    decodes: tuple[int, ...]  # context of each decode

    @staticmethod
    def of(mb: Microbatch) -> Shape:
        return Shape(tuple(r.seq_len for r in mb.prefills), tuple(r.seq_len for r in mb.decodes))

    @staticmethod
    def parse(items: str) -> Shape:
        prefills: list[int] = []
        decodes: list[int] = []
        for item in filter(None, items.split(";")):
            kind, query, context = item.split(":")
            if kind == "p":
                prefills.append(int(context))
            elif kind == "d" and int(query) in (BLOCK, BLOCK + 1):  # Dream's query reads one token more
                decodes.append(int(context))
            else:
                raise ValueError(f"bad iteration item {item!r}: expected p:S:S or d:32:C (d:33:C for Dream)")
        return Shape(tuple(prefills), tuple(decodes))

    def format(self) -> str:
        return ";".join([*(f"p:{s}:{s}" for s in self.prefills), *(f"d:{BLOCK}:{c}" for c in self.decodes)])

    def graph_bucket(self, buckets: Sequence[int]) -> int:
        """The padded batch a CUDA graph replays (decode-only, within `buckets`), else 0 (eager)."""
        if self.prefills or not self.decodes:
            return 0
        return next((b for b in sorted(buckets) if b >= len(self.decodes)), 0)
