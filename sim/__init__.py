"""SimPy drivers around the pure `sangam` core."""
