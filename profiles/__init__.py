"""Iteration-time models: measured data, fitting and prediction, and the calibration runner."""

import sangam  # noqa: F401  # its compiled-module guard runs before profiles.measured is found
