"""Autoscaler benchmarks: decision latency, and the frontier against the baselines."""
