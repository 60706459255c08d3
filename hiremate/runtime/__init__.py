"""Running a schedule: the executor module, its generated code, RNG replay, input checks and
measurement of real peaks and times."""
