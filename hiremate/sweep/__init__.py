"""Sweeps: models x budgets x methods, measured with one harness, resumable, tabled and plotted
(see docs/sweeps.md)."""
