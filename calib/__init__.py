"""Calibration against the world: testbeds fitted to observed curves (`sangam fit`) and the paper's
evaluation re-run in the simulator (`sangam reproduce`)."""
