"""The seam between the simulator and the iteration-time models in `profiles/`."""

from __future__ import annotations

from typing import Protocol

from sangam.batcher import Microbatch


class CostModel(Protocol):
    """Prices one worker iteration; the simulator waits this long before applying its progress."""

    def seconds(self, mb: Microbatch) -> float:
        """The wall time of one iteration of this microbatch on one worker."""
        ...
