"""Graph generators for tests, property tests and benchmarks (not used by the pipeline)."""
