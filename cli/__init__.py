"""The `sangam` command line: one module per subcommand, each with `add_parser` and `run`."""
