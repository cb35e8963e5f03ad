"""The one results format that sim and live runs both write.

`requests.csv`: one row per request with its latency breakdown in seconds;
`blocks.csv`: one row per block with every timestamp and placement;
`summary.json`: the resolved config and vLLM-style keys (`duration`, `failed`, `mean_e2el_ms`,
`p99_e2el_ms`, ...), one name per fact, and with worker failures what recovery did (`workers_lost`,
`requests_recovered`, `forwards_redone`; its failed requests are `failed`). The tables hold the
requests that completed.

A block's time splits exactly into prefill_queue (ready -> prefill start), prefill,
decode_queue (waiting for decode pages, then for a decode seat), transfer and decode, so
the parts of a request sum to its end-to-end latency.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sangam.batcher import Microbatch
from sangam.request import BlockRecord, Request

PARTS = ("prefill_queue", "prefill", "decode_queue", "transfer", "decode")
METRICS = ("e2el", "queue", *PARTS)
BLOCK_COLUMNS = (
    "request_id", "block", "forwards", "ready", "dispatch", "prefill_worker", "overflow", "prefill_start",
    "prefill_end", "transfer_start", "transfer_end", "decode_worker", "decode_start", "end",
)  # fmt: skip
REQUEST_COLUMNS = (
    "request_id", "arrival", "prompt_len", "output_len", "seq_len", "n_blocks", "forwards", "end", "e2el",
    "queue", *PARTS, "overflow_blocks", "kv_transfers",
)  # fmt: skip
ITERATION_COLUMNS = (
    "worker", "start", "end", "n_decodes", "decode_tokens", "n_prefills", "prefill_tokens",
    "waiting_prefills", "deficit_before", "budget", "deficit_after", "memory_blocked",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RecoveryCounts:
    """What worker failures cost a run (the router's tallies)."""

    workers_lost: int = 0
    requests_recovered: int = 0  # requests that a lost worker sent back to routing
    forwards_redone: int = 0  # forwards of restarted blocks that had already run
    requests_failed: int = 0  # requests that ended with ERROR: the layout could no longer serve them


def block_parts(rec: BlockRecord) -> tuple[float, ...]:
    """Seconds a finished block spent in each part of its life, in `PARTS` order."""
    assert rec.prefill_start is not None and rec.prefill_end is not None and rec.end is not None
    decode_queue = transfer = decode = 0.0
    decode_ready = rec.prefill_end
    if rec.transfer_start is not None and rec.transfer_end is not None:
        decode_queue = rec.transfer_start - rec.prefill_end
        transfer = rec.transfer_end - rec.transfer_start
        decode_ready = rec.transfer_end
    if rec.decode_start is not None:
        decode_queue += rec.decode_start - decode_ready
        decode = rec.end - rec.decode_start
    return rec.prefill_start - rec.ready, rec.prefill_end - rec.prefill_start, decode_queue, transfer, decode


def request_row(req: Request) -> dict[str, Any]:
    prefill_queue = prefill = decode_queue = transfer = decode = 0.0  # PARTS, summed over the blocks
    overflow_blocks = kv_transfers = 0
    for rec in req.blocks:
        a, b, c, d, e = block_parts(rec)
        prefill_queue += a
        prefill += b
        decode_queue += c
        transfer += d
        decode += e
        overflow_blocks += rec.overflow
        kv_transfers += rec.transfer_start is not None
    end = req.blocks[-1].end
    assert end is not None
    return {
        "request_id": req.id,
        "arrival": req.arrival,
        "prompt_len": req.prompt_len,
        "output_len": req.output_len,
        "seq_len": req.seq_len,
        "n_blocks": req.n_blocks,
        "forwards": sum(req.steps),
        "end": end,
        "e2el": end - req.arrival,
        "queue": prefill_queue + decode_queue,
        "prefill_queue": prefill_queue,  # PARTS, in order
        "prefill": prefill,
        "decode_queue": decode_queue,
        "transfer": transfer,
        "decode": decode,
        "overflow_blocks": overflow_blocks,
        "kv_transfers": kv_transfers,
    }


def block_rows(req: Request) -> Iterable[dict[str, Any]]:
    for index, rec in enumerate(req.blocks):
        yield {
            "request_id": req.id,
            "block": index,
            "forwards": req.steps[index],
            **{name: getattr(rec, name) for name in BLOCK_COLUMNS[3:]},
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(
    rows: Sequence[dict[str, Any]], kv_bytes_per_token: int, recovery: RecoveryCounts | None = None
) -> dict[str, Any]:
    """Throughput and mean/std/median/p90/p99 (ms) of every metric over finished requests, under the
    names `vllm bench serve` writes where the meaning is the same (`failed` counts the run's failures:
    none unless the driver says otherwise), and `recovery`'s counts if given (its failed requests are
    `failed`)."""
    counts = dataclasses.asdict(recovery) if recovery is not None else {}
    failed = counts.pop("requests_failed", 0)  # vLLM's `failed`
    if not rows:
        return {"completed": 0, "failed": failed, **counts}
    # lists, not generators, for the scans: a point sums some 4000 rows per key
    start = min([r["arrival"] for r in rows])
    duration = max([r["end"] for r in rows]) - start
    blocks = sum([r["n_blocks"] for r in rows])
    prompt_tokens = sum([r["prompt_len"] for r in rows])
    output_tokens = sum([r["output_len"] for r in rows])
    summary: dict[str, Any] = {
        "completed": len(rows),
        "failed": failed,
        "duration": duration,  # seconds, as vLLM's
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_second(len(rows), duration),
        "output_throughput": per_second(output_tokens, duration),
        "total_token_throughput": per_second(prompt_tokens + output_tokens, duration),
        "overflow_rate": sum([r["overflow_blocks"] for r in rows]) / blocks,
    }
    for metric in METRICS:
        values = sorted([r[metric] for r in rows])
        mean = sum(values) / len(values)
        summary[f"mean_{metric}_ms"] = 1000 * mean
        summary[f"std_{metric}_ms"] = 1000 * math.sqrt(sum([(v - mean) ** 2 for v in values]) / len(values))
        for label, q in (("median", 50), ("p90", 90), ("p99", 99)):
            summary[f"{label}_{metric}_ms"] = 1000 * percentile(values, q)
    moved = sum([r["seq_len"] * r["kv_transfers"] for r in rows])
    summary["kv_transferred_gb"] = moved * kv_bytes_per_token / 1e9
    summary.update(counts)
    return summary


def per_second(count: float, duration: float) -> float:
    return count / duration if duration > 0 else math.inf


def iteration_row(worker: int, start: float, end: float, mb: Microbatch) -> tuple[Any, ...]:
    """One row of the iteration log (columns ITERATION_COLUMNS)."""
    return (
        worker, start, end, len(mb.decodes), mb.decode_tokens, len(mb.prefills), mb.prefill_tokens,
        mb.waiting, mb.deficit_before, mb.budget, mb.deficit_after, int(mb.memory_blocked),
    )  # fmt: skip


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence[Any] | dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([row[c] for c in columns] if isinstance(row, dict) else row)


def write_results(out: Path, requests: Sequence[Request], summary: dict[str, Any]) -> None:
    """Write requests.csv, blocks.csv (requests that completed) and summary.json into directory `out`."""
    out.mkdir(parents=True, exist_ok=True)
    done = [r for r in requests if r.finished]
    write_csv(out / "requests.csv", REQUEST_COLUMNS, (request_row(r) for r in done))
    write_csv(out / "blocks.csv", BLOCK_COLUMNS, (row for r in done for row in block_rows(r)))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
