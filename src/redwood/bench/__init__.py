"""`redwood bench`: methods interleaved per prompt, reports, plots, scaling runs."""
