"""The checkpoint benchmarks' measurements on CPU: bf16 logits against float32 on a checkpoint in LLaDA's
layout (`benchmarks.checkpoint_logits`), and what a streamed chat turn records (`benchmarks.checkpoint_serve`,
driven by a fake client)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from benchmarks.checkpoint_logits import measure
from benchmarks.checkpoint_serve import conversation_ok, converse
from executor.model.config import Family
from sangam.hardware import BLOCK


def test_bf16_logits_differ_from_float32_by_rounding_alone(tmp_path: Path) -> None:
    rows = measure(Family.LLADA, "cpu", tmp_path / "llada", prompts=(45, 77))
    assert [row.phase for row in rows] == ["prefill", "decode"]
    for row in rows:
        assert row.positions == 2 * BLOCK
        assert 1e-4 < row.relative_error < 2e-2  # bf16's 8-bit mantissa: neither the same arithmetic nor a
        assert row.relative_max_error < 5e-2  # different model
        assert row.argmax_agreement >= 0.75  # nearly flat logits (random weights): near ties may flip


class FakeCompletions:
    """A streamed chat completion of `max_tokens // 32` chunks ("b0", "b1", ...), the last with
    `finish`, then the usage chunk; `fail_at` makes that call (0-based) raise as a lost connection."""

    def __init__(self, finish: str | None = "length", fail_at: int | None = None) -> None:
        self.finish, self.fail_at = finish, fail_at
        self.calls: list[list[dict[str, str]]] = []

    def create(self, *, messages: list[dict[str, str]], max_tokens: int, **_: Any) -> Iterator[Any]:
        self.calls.append([dict(m) for m in messages])
        if len(self.calls) - 1 == self.fail_at:
            raise openai.APIConnectionError(request=httpx.Request("POST", "http://fake/v1/chat/completions"))
        return self._chunks(max_tokens)

    def _chunks(self, max_tokens: int) -> Iterator[Any]:
        blocks = max_tokens // BLOCK
        for b in range(blocks):
            finish = self.finish if b == blocks - 1 else None
            delta = SimpleNamespace(content=f"b{b}")
            yield SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason=finish)], usage=None)
        yield SimpleNamespace(
            choices=[], usage=SimpleNamespace(prompt_tokens=7, completion_tokens=max_tokens)
        )


def client(completions: FakeCompletions) -> Any:
    return SimpleNamespace(chat=SimpleNamespace(completions=completions))


def test_a_turn_records_each_chunk_its_usage_and_finish_and_feeds_the_next_turn() -> None:
    completions = FakeCompletions()
    turns = converse(client(completions), "m", [64, 96])
    assert [(t.chunks, t.completion_tokens, t.prompt_tokens, t.finish_reason) for t in turns] == [
        (2, 64, 7, "length"), (3, 96, 7, "length"),
    ]  # fmt: skip
    for turn in turns:
        assert len(turn.arrivals_ms) == turn.chunks and turn.arrivals_ms == sorted(turn.arrivals_ms)
        assert turn.ttft_ms == turn.arrivals_ms[0] and turn.text_chars == 2 * turn.chunks
        assert turn.max_gap_ms is not None and turn.total_s * 1e3 >= turn.arrivals_ms[-1]
    second = completions.calls[1]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == "b0b1"  # the first answer, as streamed
    assert conversation_ok(turns, 2)


@pytest.mark.parametrize(
    ("completions", "ran"),
    [(FakeCompletions(finish=None), 2), (FakeCompletions(fail_at=0), 1)],
    ids=["no finish_reason", "a failed turn ends the conversation"],
)
def test_a_conversation_fails_on_a_stream_without_finish_reason_or_an_error(
    completions: FakeCompletions, ran: int
) -> None:
    turns = converse(client(completions), "m", [64, 64])
    assert len(turns) == ran
    assert not conversation_ok(turns, 2)
