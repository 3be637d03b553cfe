"""Benchmarks, run through ``gpu-scheduler bench ...``; each prints JSON."""
