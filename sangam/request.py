"""A request's life: prompt plus mask buffer, generated one 32-token block at a time.

Every block starts with a prefill over all `seq_len` tokens (the block's first denoising
forward), then runs decode steps of 32 tokens until the block's planned number of
forwards is done; its KV pages are freed when the block ends.

A request's mask buffer (its response region) is its own: its `max_tokens` rounded up to whole
blocks (`response_region`), or a fixed buffer for every request (the paper's runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sangam.hardware import BLOCK, pages_for


def response_region(max_tokens: int) -> int:
    """The mask buffer of a request that may generate `max_tokens` tokens: whole blocks, as LLaDA's and
    Dream's own generation size the response."""
    return BLOCK * -(-max_tokens // BLOCK)


@dataclass(slots=True)
class BlockRecord:
    """Timestamps (seconds) and placement of one block; None until it happens."""

    ready: float  # arrival for the first block, end of the previous block after that
    dispatch: float | None = None
    prefill_worker: int | None = None
    overflow: bool = False
    prefill_start: float | None = None
    prefill_end: float | None = None
    transfer_start: float | None = None
    transfer_end: float | None = None
    decode_worker: int | None = None
    decode_start: float | None = None
    end: float | None = None


@dataclass(slots=True, eq=False)
class Request:
    """One request; `steps[b]` is the number of forwards block b needs (1..32)."""

    id: int
    arrival: float
    prompt_len: int
    output_len: int
    mask_len: int
    steps: tuple[int, ...]
    block: int = 0
    step: int = 0  # forwards done in the current block
    blocks: list[BlockRecord] = field(default_factory=list)
    error: str | None = None  # why it could not be served (it ends with status ERROR), else None
    seq_len: int = field(init=False)  # S: the tokens every prefill of this request runs over
    pages: int = field(init=False)  # KV pages a block holds
    record: BlockRecord = field(init=False)  # the current block's record (the last one once finished)

    def __post_init__(self) -> None:
        if len(self.steps) != self.n_blocks:
            raise ValueError(f"request {self.id}: {len(self.steps)} step counts for {self.n_blocks} blocks")
        self.seq_len = self.prompt_len + self.mask_len
        self.pages = pages_for(self.seq_len)
        if not self.blocks:
            self.blocks.append(BlockRecord(ready=self.arrival))
        self.record = self.blocks[min(self.block, len(self.blocks) - 1)]

    @property
    def n_blocks(self) -> int:
        return -(-self.output_len // BLOCK)

    @property
    def finished(self) -> bool:
        return self.block >= len(self.steps)  # one count per block (checked at init)

    def end_block(self, now: float) -> None:
        """Close the current block; open the next one, ready at `now`, if any remains."""
        self.record.end = now
        self.block += 1
        self.step = 0
        if self.block < len(self.steps):
            self.record = BlockRecord(now)  # ready now
            self.blocks.append(self.record)
