"""Measuring the machine and the pair: profile, calibrate, tune, bundles."""
