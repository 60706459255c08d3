"""Chain solvers: the chain model, Rotor, rk-Rotor, the join-network DP and the sequential
baselines."""
