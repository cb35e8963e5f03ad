"""What `sched_loop.py`'s fake workers sleep: the plan's iteration-time model and KV link. Standard library
only: it runs in the reference's process, beside its package named `sangam`."""

from __future__ import annotations

from typing import Any

BLOCK = 32


class Pricing:
    """What a fake worker sleeps: the profile's formula over the plan's coefficients, and the link."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.c = plan["profile"]["coefficients"]
        self.buckets = sorted(plan["profile"]["buckets"])
        lines = plan["profile"].get("graph_times") or {"buckets": [], "fixed": [], "per_longest": []}
        pairs = zip(lines["fixed"], lines["per_longest"], strict=True)
        self.lines = dict(zip(lines["buckets"], pairs, strict=True))
        self.gbps = plan["link"]["gb_per_s"]
        self.latency = plan["link"]["latency_s"]
        self.kv_bytes = plan["kv_bytes_per_token"]
        for check in plan["checks"]:
            got = self.iteration(check["prefills"], check["decodes"])
            if abs(got - check["seconds"]) > 1e-9:
                raise SystemExit(
                    f"error: the replay prices {check} at {got}, the planner at {check['seconds']}"
                )

    def iteration(self, prefills: list[int], decodes: list[int]) -> float:
        """Seconds of one iteration: prefills of these sequence lengths, decodes of these contexts."""
        c = self.c
        bucket = 0
        if decodes and not prefills:
            bucket = next((b for b in self.buckets if b >= len(decodes)), 0)
        if bucket in self.lines:  # the bucket's own line: its replays wait for the longest context
            fixed, per_longest = self.lines[bucket]
            return fixed + per_longest * max(decodes)
        graph = 1.0 if bucket else 0.0
        items = len(prefills) + len(decodes)
        tokens = sum(prefills) + BLOCK * (bucket or len(decodes))
        return (
            c["overhead"]
            + c["graph"] * graph
            + c["per_item"] * items
            + c["per_graph_item"] * graph * items
            + c["per_mixed_decode"] * (len(decodes) if prefills else 0)
            + c["per_mixed"] * (1.0 if prefills and decodes else 0.0)
            + c["per_token"] * max(tokens, c["knee"])
            + c["per_square"] * sum(s * s for s in prefills)
            + c["per_context"] * sum(decodes)
        )

    def transfer(self, seq_len: int) -> float:
        return seq_len * self.kv_bytes / (self.gbps * 1e9) + self.latency
