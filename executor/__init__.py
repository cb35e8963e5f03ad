"""The live system, in rooms by job (lower rooms never import higher ones; pyproject.toml's contracts):

- `executor.model`: model execution on one device: the transformer, its weights, the paged KV cache,
  microbatch packing, attention backends, CUDA graphs, the sampler (torch, no gRPC);
- `executor.control`: the control plane: typed messages and their protobuf codec, gRPC plumbing, auth,
  retries, admission checks, the client, and the scheduler service with its state (no torch);
- `executor.transfer`: KV transfer between workers: torch.distributed links, and a worker's ends;
- `executor.worker`: a worker process: its gRPC front end and loop, the engine, the report sender;
- `executor.run`: run orchestration: the launcher, `sangam live`, its options, collection and tally.

`executor.proto` is the generated wire schema.
"""
