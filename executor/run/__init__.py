"""Run orchestration: the launcher of the scheduler and worker processes, `sangam live` (options,
replay, collection, progress tally) and loopback ports."""
