"""KV page accounting in integers: which request holds which pages of one worker (`PagePool`, the live
worker's), or only how many (`PageTally`, the simulator's: the scheduler needs the counts alone)."""

from __future__ import annotations

from typing import Protocol


class Pages(Protocol):
    """What the batcher asks of a worker's KV pages."""

    @property
    def num_free(self) -> int: ...

    def can_allocate(self, pages: int) -> bool: ...

    def allocate(self, owner: int, pages: int) -> object: ...

    def release(self, owner: int) -> int: ...

    def holds(self, owner: int) -> bool: ...


class PagePool:
    """A worker's KV pages; `allocate` hands out page ids, `release` takes them all back."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a KV pool needs at least one page, got {capacity}")
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))
        self._held: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def can_allocate(self, pages: int) -> bool:
        return pages <= len(self._free)

    def allocate(self, owner: int, pages: int) -> list[int]:
        """Give `owner` (a request id) `pages` pages; an owner holds one allocation at a time."""
        free = self._free
        if owner in self._held:
            raise ValueError(f"request {owner} already holds KV pages")
        if pages > len(free):
            raise MemoryError(f"request {owner} needs {pages} pages, {len(free)} free")
        split = len(free) - pages
        ids = free[split:]
        del free[split:]
        self._held[owner] = ids
        return ids

    def release(self, owner: int) -> int:
        """Return every page `owner` holds; the number returned."""
        ids = self._held.pop(owner)
        self._free.extend(ids)
        return len(ids)

    def pages_of(self, owner: int) -> list[int]:
        return self._held[owner]

    def holds(self, owner: int) -> bool:
        return owner in self._held


class PageTally:
    """`PagePool`'s accounting without page ids: the same checks and counts, no list of ids to copy."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a KV pool needs at least one page, got {capacity}")
        self.capacity = capacity
        self.num_free = capacity
        self._held: dict[int, int] = {}

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def can_allocate(self, pages: int) -> bool:
        return pages <= self.num_free

    def allocate(self, owner: int, pages: int) -> int:
        """Give `owner` (a request id) `pages` pages; an owner holds one allocation at a time."""
        if owner in self._held:
            raise ValueError(f"request {owner} already holds KV pages")
        if pages > self.num_free:
            raise MemoryError(f"request {owner} needs {pages} pages, {self.num_free} free")
        self.num_free -= pages
        self._held[owner] = pages
        return pages

    def release(self, owner: int) -> int:
        """Return every page `owner` holds; the number returned."""
        pages = self._held.pop(owner)
        self.num_free += pages
        return pages

    def holds(self, owner: int) -> bool:
        return owner in self._held
