"""FastSA: simulated annealing over compute sequences, with an optional numba kernel."""
