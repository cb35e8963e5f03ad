"""The control plane: the typed messages the scheduler, the workers and clients exchange, their protobuf
codec, gRPC plumbing, auth, retries and admission checks, the client, the child processes' launch specs,
and the scheduler service with its state and its KV transfers' state machine. No torch."""
