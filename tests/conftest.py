"""Test-wide settings. Property tests have no per-example deadline: speed is measured by `benchmarks/`, and a
loaded 2-core CI machine must not turn one slow example into a failure."""

from hypothesis import settings

settings.register_profile("sangam", deadline=None)
settings.load_profile("sangam")
