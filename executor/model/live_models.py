"""Names of the models a live run can serve, importable without torch (the launcher validates with them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LiveModel:
    name: str
    family: str  # executor.model.config.Family value
    spec: str  # sangam.hardware.MODELS key: shapes for KV bytes, pages and the progress model
    tiny: bool  # the two-layer CPU twin (random weights only)


LIVE_MODELS: dict[str, LiveModel] = {
    m.name: m
    for m in (
        LiveModel("tiny-llada", "llada", "llada-8b", tiny=True),
        LiveModel("tiny-dream", "dream", "dream-7b", tiny=True),
        LiveModel("llada-8b", "llada", "llada-8b", tiny=False),
        LiveModel("dream-7b", "dream", "dream-7b", tiny=False),
    )
}

TINY_PAGES = 4096  # default KV pool of a tiny CPU worker: 64 MiB of float32 K/V for tiny LLaDA


def lookup_live_model(name: str) -> LiveModel:
    try:
        return LIVE_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown live model {name!r} (known: {', '.join(LIVE_MODELS)})") from None
