"""The server's Prometheus metrics, in a registry of their own; names mirror vLLM's where the meaning
matches (`vllm:e2e_request_latency_seconds` -> `sangam:e2e_request_latency_seconds`).

Per request, once it ends: end-to-end latency (HTTP arrival to the last block), and the scheduler's
split of it summed over the request's blocks: queue time (waiting for a prefill, then for a decode seat;
a dLLM waits again before every block), prefill time, decode time. The dLLM's own: forwards each block
took, blocks run, prefills that overflowed to a colocated worker (hybrid layouts) and each KV transfer's
duration. Gauges are read when scraped: requests waiting (queued at the scheduler) and running, each
worker's share of KV pages in use, and the forwards its blocks have run (what losing it would redo).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from executor.control.messages import RequestState, WorkerState

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
FORWARD_BUCKETS = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32)
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
FINISHED_REASONS = ("stop", "length", "abort", "error")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model}

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            metric = Histogram(f"sangam:{name}", doc, ["model_name"], buckets=buckets, registry=self.registry)
            return metric.labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sangam:{name}", doc, ["model_name"], registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sangam:{name}", doc, ["model_name"], registry=self.registry).labels(**labels)

        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency", LATENCY_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Time waiting for a prefill or a decode seat", LATENCY_BUCKETS
        )
        self.prefill = histogram("request_prefill_time_seconds", "Time in prefills", LATENCY_BUCKETS)
        self.decode = histogram("request_decode_time_seconds", "Time in decode steps", LATENCY_BUCKETS)
        self.forwards = histogram("forwards_per_block", "Forwards a 32-token block took", FORWARD_BUCKETS)
        self.kv_transfer = histogram("kv_transfer_seconds", "Duration of a KV transfer", TRANSFER_BUCKETS)
        self.blocks = counter("blocks", "32-token blocks run")
        self.overflows = counter("prefill_overflow", "Prefills overflowed to a colocated worker")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("generation_tokens", "Tokens returned to clients")
        self.running = gauge("num_requests_running", "Requests with a block at a worker")
        self.waiting = gauge("num_requests_waiting", "Requests queued at the scheduler")
        self._success = Counter(
            "sangam:request_success", "Requests ended, by finish reason", ["model_name", "finished_reason"],
            registry=self.registry,
        )  # fmt: skip
        for reason in FINISHED_REASONS:
            self._success.labels(model_name=model, finished_reason=reason)
        self._kv = Gauge(
            "sangam:kv_cache_usage_perc", "Share of a worker's KV pages in use (0 to 1)",
            ["model_name", "worker"], registry=self.registry,
        )  # fmt: skip
        self._at_risk = Gauge(
            "sangam:worker_forwards_at_risk", "Forwards a worker's blocks have run (a loss redoes them)",
            ["model_name", "worker"], registry=self.registry,
        )  # fmt: skip
        self._model = model

    def finished(
        self, result: RequestState | None, e2e_s: float, reason: str, prompt: int, generated: int
    ) -> None:
        """A request ended (`reason`: stop, length, abort or error) in its last state `result`."""
        self._success.labels(model_name=self._model, finished_reason=reason).inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        if result is None or result.status != "DONE":
            return
        self.e2e.observe(e2e_s)
        self.queue.observe(result.queue_s)
        self.prefill.observe(result.prefill_s)
        self.decode.observe(result.decode_s)
        for forwards in result.forwards:
            self.forwards.observe(forwards)
        for seconds in result.transfer_s:
            self.kv_transfer.observe(seconds)
        self.blocks.inc(len(result.forwards))
        self.overflows.inc(result.overflow_blocks)

    def scrape(self, waiting: int, running: int, workers: Sequence[WorkerState]) -> bytes:
        """The exposition text, with the gauges set to the current state."""
        self.waiting.set(waiting)
        self.running.set(running)
        for w in workers:
            used = 1.0 - w.free_pages / w.pages if w.pages else 0.0
            self._kv.labels(model_name=self._model, worker=str(w.worker_id)).set(used)
            self._at_risk.labels(model_name=self._model, worker=str(w.worker_id)).set(w.forwards_at_risk)
        return generate_latest(self.registry)
