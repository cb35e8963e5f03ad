"""What a run is given and what it leaves, shared by the simulator and the live system: the run's
configuration and its command-line declarations, trace files, the one results format, output folders,
the printed table and progress tallies. Above the policy core (`sangam`), below every driver."""
