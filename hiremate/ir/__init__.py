"""The intermediate representation every stage shares: CD-graphs, schedules, options, blocks,
and the simulator that is the one memory model."""
