"""Iteration-time models (measured, fitted, derived, analytic) and the testbeds that choose them."""
