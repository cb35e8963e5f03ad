"""SimPy drivers around the pure `sangam` core."""

import sangam  # noqa: F401  # its compiled-module guard runs before sim.cluster is found
