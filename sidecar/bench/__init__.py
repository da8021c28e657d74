"""Benchmarks run by ``memwarden bench …`` (sidecar.cli): public data sets replayed through the sidecar."""
