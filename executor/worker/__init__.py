"""A live worker process: its gRPC front end and loop (`process`), the engine that turns blocks into
forwards, the report sender and the hang watch."""
