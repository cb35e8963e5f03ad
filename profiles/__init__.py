"""Iteration-time models: measured data, fitting and prediction, and the calibration runner."""
