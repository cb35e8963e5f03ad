"""Test-wide settings. Property tests have no per-example deadline: speed is measured by `benchmarks/`, and a
loaded 2-core CI machine must not turn one slow example into a failure."""

import pytest
from hypothesis import settings

from runs.build import StaleBuild, check

settings.register_profile("sangam", deadline=None)
settings.load_profile("sangam")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test a native build older than its sources: it would test the old code."""
    try:
        check()
    except StaleBuild as err:
        raise pytest.UsageError(str(err)) from None
