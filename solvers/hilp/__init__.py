"""H-ILP: the rk-Checkmate MILP on a flat graph, its hierarchical variant over blocks with
option menus (``hilp-top``), and the MILP backends (HiGHS, CP-SAT, CBC)."""
