"""Live execution: model code, paged KV cache, attention backends and the sampler (torch side)."""
