"""Benchmarks: kernels, mixers, trainer throughput."""
