"""The composer: splits a graph into blocks, gathers each block's menu from the bottom solvers,
asks the top composers for whole-graph schedules and keeps the fastest valid one."""
