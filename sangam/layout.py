"""Serving layouts and the `--mode` strings that name them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    COLOCATED = "colocated"  # every worker prefills and decodes under the deficit budget
    DISAGGREGATED = "disaggregated"  # <n>P<m>D: prefill-only and decode-only pools
    HYBRID = "hybrid"  # <n>P<m>C: prefill pool plus colocated decode-role workers (overflow)


class Role(StrEnum):
    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Layout:
    """Worker ids 0..n_prefill-1 are the prefill pool; the rest take the decode role."""

    kind: Kind
    n_prefill: int
    n_decode: int

    @property
    def num_workers(self) -> int:
        return self.n_prefill + self.n_decode

    @property
    def roles(self) -> tuple[Role, ...]:
        if self.kind is Kind.COLOCATED:
            return (Role.COLOCATED,) * self.n_decode
        second = Role.DECODE if self.kind is Kind.DISAGGREGATED else Role.COLOCATED
        return (Role.PREFILL,) * self.n_prefill + (second,) * self.n_decode

    @property
    def name(self) -> str:
        if self.kind is Kind.COLOCATED:
            return f"{self.n_decode}C"
        suffix = "D" if self.kind is Kind.DISAGGREGATED else "C"
        return f"{self.n_prefill}P{self.n_decode}{suffix}"


_SPLIT = re.compile(r"(\d+)P(\d+)([DC])")


MAX_WORKERS = 1024  # a cluster's workers, at most (the paper's has 8)


def parse_mode(mode: str, gpus: int = 8) -> Layout:
    """`colocated` (all `gpus` workers), `<n>C`, `<n>P<m>D` or `<n>P<m>C`."""
    text = mode.strip()
    if text.lower() == "colocated":
        return _checked(Layout(Kind.COLOCATED, 0, gpus), mode)
    if m := re.fullmatch(r"(\d+)C", text, re.IGNORECASE):
        return _checked(Layout(Kind.COLOCATED, 0, int(m[1])), mode)
    if m := _SPLIT.fullmatch(text.upper()):
        kind = Kind.DISAGGREGATED if m[3] == "D" else Kind.HYBRID
        return _checked(Layout(kind, int(m[1]), int(m[2])), mode)
    raise ValueError(f"bad mode {mode!r}: use colocated, <n>C, <n>P<m>D or <n>P<m>C (for example 5P3C)")


def _checked(layout: Layout, mode: str) -> Layout:
    if layout.n_decode < 1 or (layout.kind is not Kind.COLOCATED and layout.n_prefill < 1):
        raise ValueError(f"bad mode {mode!r}: every pool needs at least one worker")
    if layout.num_workers > MAX_WORKERS:
        raise ValueError(f"bad mode {mode!r}: {layout.num_workers} workers, more than {MAX_WORKERS}")
    return layout
