"""A whole training step as the solvers see it: what the executor holds beyond the graph's own
values, made into memory the solvers place instead of a reserve they are blind to.

The rule is :func:`hiremate.ir.simulator.step_peak`: the user's loss allocates memory at the
loss step; autograd holds the output gradients until the executor's backward returns; and
the executor saves a random op's generator state before its first run when the schedule runs
it again, keeps it until the last rerun, and during a rerun also holds the state it
interrupted. :func:`step_view` builds a graph in which all of that is ordinary memory, so that
one solve usually fits the step (``tests/test_step_view.py`` pins the view to the rule on
random graphs with random ops).

Why each state is counted from the loss to the last backward node that may need a rerun, and
not from the op's first run or to the end: a value the op made would be made again by its
reruns (a state cannot be), a node of its own that keeps it is an output producer that the
solvers place badly, and states kept to the end cost schedules much more than the walk they
replace (docs/results-history.md, "Stop 36", has the figures of each).
"""

from __future__ import annotations

from dataclasses import dataclass

from hiremate.ir.graph import DataKind, Graph
from hiremate.ir.schedule import Delete, Schedule
from hiremate.ir.simulator import replay_state_bytes


def rng_state_reserve(graph: Graph) -> int:
    """Bytes of every random op's generator state and the one a rerun interrupts: the most
    the executor keeps for reruns at once (0 when the states are not in the budget)."""
    per_state = int(graph.meta.get("rng_state_bytes", 0) or 0)
    randoms = sum(1 for n in graph.nodes if n.random)
    return per_state * (randoms + 1) if per_state and randoms else 0


@dataclass(frozen=True)
class StepView:
    """``graph``: what the solvers schedule, with the graph's node and data ids (and the
    states' values after the data); ``data``: how many data the graph has."""

    graph: Graph
    data: int

    def schedule_of(self, schedule: Schedule) -> Schedule:
        """A schedule of the view as one of the graph: frees of the states' values (which the
        executor does by itself) left out."""
        return tuple(s for s in schedule if not (isinstance(s, Delete) and s.data >= self.data))


def last_needed(graph: Graph) -> dict[int, int]:
    """For each random forward op, the last backward node that reads a value made from its
    outputs (directly or through forward ops): after it no schedule that recomputes only what
    it needs reruns the op. Random ops no backward node depends on are left out: no schedule
    needs to rerun them."""
    last_reader = [-1] * len(graph.data)
    for node in graph.nodes:
        if node.is_bwd:
            for d in node.inputs:
                last_reader[d] = max(last_reader[d], node.id)
    need = [-1] * len(graph.nodes)
    for node in reversed(graph.nodes):
        if not node.is_fwd:
            continue
        for d in node.outputs:
            need[node.id] = max(need[node.id], last_reader[d],
                                max((need[u] for u in graph.users(d) if graph.nodes[u].is_fwd),
                                    default=-1))
    return {n.id: need[n.id] for n in graph.nodes if n.random and n.is_fwd and need[n.id] >= 0}


def step_view(graph: Graph, loss_bytes: int, rng_states: bool) -> StepView:
    """``graph`` as the solvers see a whole step:

    - the output gradients are of a kind that must be alive at the end (deleting one would
      free nothing while autograd holds it);
    - what the user's loss allocates is the loss node's temporary memory;
    - with ``rng_states`` (and random ops whose states count), the loss node also makes, for
      each random op that a backward node depends on, a value of its state's size, read by the
      last such backward node (:func:`last_needed`): the executor keeps a rerun op's state
      until its last rerun, which a schedule places before that node; and the op's temporary
      memory grows by one state, the one a rerun interrupts. The view counts each state from
      the loss, whether or not the op is rerun: the price of fitting in one solve. Before the
      loss it counts none: a schedule that peaks in the forward while keeping a state for a
      later rerun can exceed the view by the states kept (the walk of
      :func:`hiremate.composer.whole_step.solve_whole_step` checks and corrects).

    The states of a call's start that a backward may need to run the call again
    (:func:`~hiremate.ir.simulator.replay_state_bytes`) are held through the whole step: every
    node's temporary memory grows by them, with or without ``rng_states``. Without states the
    view's peak on a schedule is the rule's."""
    payload = graph.to_dict()
    replay = replay_state_bytes(graph)
    if replay:
        for node in payload["nodes"]:
            node["overhead"] += replay
    for datum in payload["data"]:
        if datum["kind"] == DataKind.TANGENT.value:
            datum["kind"] = DataKind.INPUT_GRAD.value
    loss = payload["nodes"][graph.loss]
    loss["overhead"] += int(loss_bytes)
    if rng_states and rng_state_reserve(graph):
        per_state = int(graph.meta["rng_state_bytes"])
        for op, reader in sorted(last_needed(graph).items()):
            sid = len(payload["data"])
            payload["data"].append({
                "id": sid, "name": f"generator_state_{op}", "kind": DataKind.TANGENT.value,
                "shape": [per_state], "dtype": "uint8", "size": per_state,
                "producer": graph.loss, "aliases": []})
            loss["outputs"].append(sid)
            payload["nodes"][reader]["inputs"].append(sid)
            payload["nodes"][op]["overhead"] += per_state
    return StepView(Graph.from_dict(payload), len(graph.data))
