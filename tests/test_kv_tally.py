"""The simulator's `PageTally` keeps `PagePool`'s books: the same counts and refusals for any sequence of
allocations and releases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sangam.kv import PagePool, PageTally

OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 40)), max_size=60)


def apply(pool: PagePool | PageTally, ops: list[tuple[bool, int, int]]) -> list[object]:
    seen: list[object] = []
    for allocate, owner, pages in ops:
        try:
            if allocate:
                pool.allocate(owner, pages)
                seen.append(("held", owner, pool.holds(owner)))
            else:
                seen.append(("released", pool.release(owner)))
        except (ValueError, MemoryError, KeyError) as err:
            seen.append(type(err).__name__)
        seen.append((pool.num_free, pool.num_used, pool.can_allocate(pages)))
    return seen


@given(OPS)
def test_the_tally_counts_as_the_pool_does(ops: list[tuple[bool, int, int]]) -> None:
    assert apply(PageTally(64), ops) == apply(PagePool(64), ops)


def test_an_empty_tally_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one page"):
        PageTally(0)
