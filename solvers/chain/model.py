"""Chains of stages, the operations the chain solvers schedule, and their memory model.

A chain (Rotor paper, section 3.1) is a sequence of stages
``1..n``; stage ``k`` reads the activation ``a^{k-1}`` and produces ``a^k``. The last stage plays
the role of the loss in the paper (its ``F^{L+1}``/``B^{L+1}``): its forward runs once, right
before its backward, which starts the backward phase (the *turn*). Backward ``B^k`` reads the
gradient ``δ^k``, the values ``ā^k`` that stage ``k`` keeps for its backward (``ā^k`` contains
``a^k``) and ``a^{k-1}``, and produces ``δ^{k-1}``.

Operations (Table 1 of the paper), each *replacing* its inputs by its outputs:

- ``F_ck(k)``: forward, keeps its input ``a^{k-1}`` (checkpoint) and stores ``a^k``;
- ``F_e(k)`` (the paper's ``F_∅``): forward that frees its input ``a^{k-1}``;
- ``F_all(k)``: forward that keeps its input and stores ``ā^k`` (everything ``B^k`` needs);
- ``B(k)``: backward; frees ``δ^k``, ``ā^k`` and ``a^{k-1}`` and stores ``δ^{k-1}``.

Deletions are implied by the operations (they are what the chain DPs reason about);
:func:`chain_step` reports what each operation frees, and :func:`ops_to_schedule` turns a
sequence into ``Delete`` steps of a graph schedule. A value that exists only inside ``ā^{k}``
is not freed by ``F_e(k+1)`` or ``B(k+1)``: ``ā^k`` lives until ``B(k)``. The input ``a^0`` is
held by the caller and never freed.

Memory (Definitions 3.3 and 3.4): while an operation runs, memory holds what is stored, the
operation's output and its overhead. ``kept_after_loss`` models values that stay alive from the
end of the last stage's backward on (in a hiremate graph, the model output, owned by the caller).
"""

from __future__ import annotations

import abc

import math
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Sequence

from hiremate.errors import InvalidGraphError, InvalidScheduleError, SolverError


class OpKind(str, Enum):
    """Kind of a chain operation."""

    F_CK = "Fck"
    F_ALL = "Fall"
    F_E = "Fe"
    B = "B"


@dataclass(frozen=True, slots=True)
class ChainOp:
    """One operation on stage ``stage`` (1-based, as in the paper)."""

    kind: OpKind
    stage: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.stage}"


def F_ck(k: int) -> ChainOp:  # noqa: N802 - the paper's names
    return ChainOp(OpKind.F_CK, k)


def F_all(k: int) -> ChainOp:  # noqa: N802
    return ChainOp(OpKind.F_ALL, k)


def F_e(k: int) -> ChainOp:  # noqa: N802
    return ChainOp(OpKind.F_E, k)


def B(k: int) -> ChainOp:  # noqa: N802
    return ChainOp(OpKind.B, k)


def parse_ops(text: str) -> tuple[ChainOp, ...]:
    """``"Fck1 Fe2 Fall3 B3"`` -> operations (handy in tests and docs)."""
    ops = []
    for token in text.split():
        for kind in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_E, OpKind.B):
            if token.startswith(kind.value) and token[len(kind.value):].isdigit():
                ops.append(ChainOp(kind, int(token[len(kind.value):])))
                break
        else:
            raise InvalidScheduleError(f"cannot parse chain operation {token!r}; write "
                                       "operations as Fck<k>, Fe<k>, Fall<k> or B<k>")
    return tuple(ops)


@dataclass(frozen=True)
class Chain:
    """Costs of a chain of ``n`` stages (the last one is the loss stage).

    Lists are indexed so that the paper's notation reads directly: per-stage lists have ``n``
    entries, entry ``k - 1`` for stage ``k``; ``x`` and ``delta`` have ``n + 1`` entries, entry
    ``k`` for ``a^k`` and ``δ^k``. Sizes may be bytes or any unit (the toy example uses MB);
    times are in any unit.

    - ``fwd_time``/``bwd_time``: ``u_f^k``, ``u_b^k``;
    - ``x``: ``ω_a^k``, size of the stage outputs (``x[0]``: the input, counted but never freed);
    - ``xbar``: ``ω_ā^k``, size of everything ``F_all(k)`` keeps for ``B(k)`` (``≥ x[k]``);
    - ``delta``: ``ω_δ^k``; ``delta[n]`` is what the loss stage's backward starts from;
    - ``fwd_overhead``/``bwd_overhead``: ``o_f^k``, ``o_b^k``;
    - ``kept_after_loss``: bytes alive from the end of ``B(n)`` to the end.
    """

    fwd_time: tuple[float, ...]
    bwd_time: tuple[float, ...]
    x: tuple[float, ...]
    xbar: tuple[float, ...]
    delta: tuple[float, ...]
    fwd_overhead: tuple[float, ...]
    bwd_overhead: tuple[float, ...]
    kept_after_loss: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.fwd_time)
        if n < 1:
            raise InvalidGraphError("a chain needs at least one stage (the loss stage)")
        for name, length in (("bwd_time", n), ("xbar", n), ("fwd_overhead", n),
                             ("bwd_overhead", n), ("x", n + 1), ("delta", n + 1)):
            if len(getattr(self, name)) != length:
                raise InvalidGraphError(f"Chain.{name} has {len(getattr(self, name))} "
                                        f"entries, expected {length} for {n} stages")
        for name in ("fwd_time", "bwd_time", "x", "xbar", "delta", "fwd_overhead",
                     "bwd_overhead"):
            if any(v < 0 for v in getattr(self, name)):
                raise InvalidGraphError(f"Chain.{name} has a negative entry; times and sizes "
                                        "are non-negative")
        object.__setattr__(self, "fwd_time", tuple(self.fwd_time))
        for name in ("bwd_time", "x", "xbar", "delta", "fwd_overhead", "bwd_overhead"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def n(self) -> int:
        """Number of stages, the loss stage included."""
        return len(self.fwd_time)

    @classmethod
    def from_paper(cls, x: Sequence[float], xbar: Sequence[float], uf: Sequence[float],
                   ub: Sequence[float], of: Sequence[float] | None = None,
                   ob: Sequence[float] | None = None, delta: Sequence[float] | None = None,
                   kept_after_loss: float = 0.0) -> "Chain":
        """Build a chain from the paper's tables: ``x = [ω_a^0..ω_a^n]``, ``xbar =
        [ω_ā^1..ω_ā^n]``, times and overheads per stage; ``delta`` defaults to ``x``."""
        n = len(uf)
        return cls(
            fwd_time=tuple(uf), bwd_time=tuple(ub), x=tuple(x), xbar=tuple(xbar),
            delta=tuple(delta if delta is not None else x),
            fwd_overhead=tuple(of if of is not None else [0.0] * n),
            bwd_overhead=tuple(ob if ob is not None else [0.0] * n),
            kept_after_loss=kept_after_loss,
        )

    def store_all_time(self) -> float:
        """Makespan without recomputation."""
        return math.fsum(self.fwd_time) + math.fsum(self.bwd_time)


class ChainState(NamedTuple):
    """What is stored between two operations.

    ``plain``: stages ``k ≥ 1`` whose ``a^k`` is stored on its own; ``bar``: stages whose
    ``ā^k`` is stored; ``grad``: ``k`` such that ``δ^k`` is stored; ``turned``: ``B(n)`` ran;
    ``mem``: bytes stored (``x[0]`` included).
    """

    plain: frozenset[int]
    bar: frozenset[int]
    grad: int
    turned: bool
    mem: float


class ChainStepError(InvalidScheduleError):
    """An operation cannot run in the given state."""


def initial_state(chain: Chain) -> ChainState:
    """``a^0`` and ``δ^n`` stored."""
    n = chain.n
    return ChainState(frozenset(), frozenset(), n, False, chain.x[0] + chain.delta[n])


def available(state: ChainState, k: int) -> bool:
    """Whether ``a^k`` can be read (alone or inside ``ā^k``)."""
    return k == 0 or k in state.plain or k in state.bar


def chain_step(chain: Chain, state: ChainState, op: ChainOp
               ) -> tuple[ChainState, float, tuple[tuple[str, int], ...]]:
    """Run ``op``: the new state, the memory while it runs, and what it frees
    (``("a", k)``, ``("abar", k)``, ``("delta", k)``). Raise :class:`ChainStepError`."""
    n = chain.n
    k = op.stage
    if not 1 <= k <= n:
        raise ChainStepError(f"{op}: there is no stage {k} (stages are 1..{n})")
    plain, bar = state.plain, state.bar
    freed: list[tuple[str, int]] = []
    if op.kind is OpKind.B:
        if state.grad != k:
            raise ChainStepError(f"{op}: needs δ^{k}, but δ^{state.grad} is stored")
        if k not in bar:
            raise ChainStepError(f"{op}: needs ā^{k} (run F_all({k}) first)")
        if not available(state, k - 1):
            raise ChainStepError(f"{op}: needs a^{k - 1}")
        during = state.mem + chain.delta[k - 1] + chain.bwd_overhead[k - 1]
        mem = state.mem - chain.xbar[k - 1] - chain.delta[k] + chain.delta[k - 1]
        bar = bar - {k}
        freed += [("abar", k), ("delta", k)]
        if k - 1 in plain:
            plain = plain - {k - 1}
            mem -= chain.x[k - 1]
            freed.append(("a", k - 1))
        turned = state.turned
        if k == n:
            turned = True
            mem += chain.kept_after_loss
        return ChainState(plain, bar, k - 1, turned, mem), during, tuple(freed)
    if not available(state, k - 1):
        raise ChainStepError(f"{op}: needs a^{k - 1}, which is not stored")
    if k in bar:
        raise ChainStepError(f"{op}: ā^{k} is already stored")
    if op.kind is OpKind.F_ALL:
        during = state.mem + chain.xbar[k - 1] + chain.fwd_overhead[k - 1]
        mem = state.mem + chain.xbar[k - 1]
        if k in plain:  # a^k is absorbed into ā^k
            plain = plain - {k}
            mem -= chain.x[k]
        return ChainState(plain, bar | {k}, state.grad, state.turned, mem), during, ()
    if k == n:
        raise ChainStepError(f"{op}: the loss stage's forward runs only as F_all({n})")
    if k in plain:
        raise ChainStepError(f"{op}: a^{k} is already stored")
    during = state.mem + chain.x[k] + chain.fwd_overhead[k - 1]
    mem = state.mem + chain.x[k]
    plain = plain | {k}
    if op.kind is OpKind.F_E and k - 1 in state.plain:
        plain = plain - {k - 1}
        mem -= chain.x[k - 1]
        freed.append(("a", k - 1))
    return ChainState(plain, bar, state.grad, state.turned, mem), during, tuple(freed)


@dataclass(frozen=True)
class ChainResult:
    """Replay of a chain sequence: validity, makespan and peak (in the chain's units)."""

    valid: bool
    makespan: float
    peak: float
    error: str | None = None
    freed: tuple[tuple[tuple[str, int], ...], ...] = ()


def simulate_chain(chain: Chain, ops: Sequence[ChainOp]) -> ChainResult:
    """Replay ``ops`` from the initial state; valid when every operation can run and ``δ^0``
    is computed at the end."""
    state = initial_state(chain)
    peak = state.mem
    times: list[float] = []
    freed_all = []
    for i, op in enumerate(ops):
        try:
            state, during, freed = chain_step(chain, state, op)
        except ChainStepError as exc:
            return ChainResult(False, math.fsum(times), peak, f"operation {i}: {exc}",
                               tuple(freed_all))
        peak = max(peak, during, state.mem)
        times.append(chain.bwd_time[op.stage - 1] if op.kind is OpKind.B
                     else chain.fwd_time[op.stage - 1])
        freed_all.append(freed)
    if state.grad != 0:
        return ChainResult(False, math.fsum(times), peak,
                           f"end of sequence: δ^0 not computed (δ^{state.grad} stored)",
                           tuple(freed_all))
    return ChainResult(True, math.fsum(times), peak, None, tuple(freed_all))


@dataclass(frozen=True)
class ChainSolution:
    """A chain solver's answer: the operations, their makespan and peak (from
    :func:`simulate_chain`), and the budget it was solved for."""

    ops: tuple[ChainOp, ...]
    makespan: float
    peak: float
    budget: float

    def __str__(self) -> str:
        return " ".join(str(op) for op in self.ops)


def solution(chain: Chain, ops: Sequence[ChainOp], budget: float) -> ChainSolution:
    """Wrap ``ops`` after checking them with the chain simulator (a solver bug otherwise)."""
    result = simulate_chain(chain, ops)
    if not result.valid:
        raise SolverError(f"the chain solver produced an invalid sequence ({result.error}): a "
                          "bug in hiremate; please report it")
    return ChainSolution(tuple(ops), result.makespan, result.peak, budget)


def store_all_ops(chain: Chain) -> tuple[ChainOp, ...]:
    """``F_all(1..n) B(n..1)``: the sequence without recomputation."""
    n = chain.n
    return tuple([F_all(k) for k in range(1, n + 1)] + [B(k) for k in range(n, 0, -1)])


# -- chain-shaped hiremate graphs ------------------------------------------------------------
@dataclass(frozen=True)
class GraphChain:
    """Where the stages of a chain-shaped :class:`~hiremate.ir.graph.Graph` live.

    Stage ``k < n`` is forward node ``fwd[k-1]`` and its backward partner; the last stage
    (the loss stage) is the last forward node, whose backward is the loss node followed by the
    last forward node's partner (so the model output, which the caller owns, is produced once).
    ``act[k]`` is the data id of ``a^k`` (``None`` for the user input), ``grad[k]`` the data ids
    of ``δ^k``, ``bwd_internal`` the data produced and consumed inside the loss stage's backward,
    ``tail`` the backward nodes that run after ``B(1)`` (sums of input gradients).
    """

    chain: Chain
    fwd: tuple[int, ...]
    bwd: tuple[tuple[int, ...], ...]
    act: tuple[int | None, ...]
    grad: tuple[tuple[int, ...], ...]
    bwd_internal: tuple[int, ...]
    tail: tuple[int, ...]
    protected: frozenset[int]
    tail_need: int


def graph_chain(graph) -> tuple[GraphChain | None, str]:
    """Recognise a chain-shaped graph: ``(GraphChain, "")`` or ``(None, why not)``."""
    from hiremate.ir.graph import DataKind

    data = graph.data
    nodes = graph.nodes
    counted = lambda ids: [d for d in ids if data[d].counted]  # noqa: E731
    fwd = [nd for nd in nodes if nd.is_fwd]
    if not fwd:
        return None, "the graph has no forward node"
    n = len(fwd)
    act: list[int | None] = [None]
    for i, f in enumerate(fwd):
        outs = counted(f.outputs)
        if len(f.outputs) != 1 or len(outs) != 1 or data[outs[0]].kind is not DataKind.ACTIVATION:
            return None, f"forward node {f.name!r} does not produce exactly one activation"
        ins = counted(f.inputs)
        expect = [] if i == 0 else [act[-1]]
        if ins != expect:
            return None, f"forward node {f.name!r} does not read exactly the previous activation"
        if f.partner is None or not nodes[f.partner].is_bwd:
            return None, f"forward node {f.name!r} has no backward partner"
        act.append(outs[0])
    loss = nodes[graph.loss]
    if counted(loss.inputs) != [act[n]]:
        return None, "the loss node does not read exactly the last activation"
    tangent = tuple(counted(loss.outputs))
    bwd_of = [nodes[f.partner] for f in fwd]
    grad: list[tuple[int, ...]] = [()] * (n + 1)
    for k in range(n, 0, -1):
        b = bwd_of[k - 1]
        incoming = tangent if k == n else grad[k]
        allowed = set(incoming) | {act[k]} | ({act[k - 1]} if k > 1 else set())
        if not set(counted(b.inputs)) <= allowed:
            return None, f"backward node {b.name!r} reads values outside its stage"
        grad[k - 1] = tuple(counted(b.outputs))
    partner_ids = {b.id for b in bwd_of}
    # a stage's gradients must flow into the previous stage only (a gradient of a user input
    # made mid-chain, e.g. by a skip from the input, would be freed before the tail reads it)
    for k in range(1, n):
        for g in grad[k]:
            if not set(graph.users(g)) <= {bwd_of[k - 1].id}:
                return None, f"gradient {data[g].name!r} is read outside the previous stage"
    tail = [nd for nd in nodes if nd.is_bwd and nd.id not in partner_ids]
    if n + 1 + n + len(tail) != len(nodes):
        return None, "the graph has nodes outside the chain"
    # users of each activation stay within the neighbouring stages
    for k in range(1, n + 1):
        ok = {fwd[k - 1].partner} | ({fwd[k].id, fwd[k].partner} if k < n else {loss.id})
        if not set(graph.users(act[k])) <= ok:
            return None, f"activation {data[act[k]].name!r} is read outside its stages"
    tail_ids = {nd.id for nd in tail}
    for g in grad[0]:
        if not set(graph.users(g)) <= tail_ids:
            return None, "the input gradients are read by a non-final node"
    protected = frozenset(graph.outputs) | frozenset(graph.final_data)
    size = lambda ids: sum(data[d].size for d in ids if data[d].counted)  # noqa: E731
    x = [0] + [data[a].size for a in act[1:]]
    delta = [size(g) for g in grad[:n]] + [0]
    o_f = [f.overhead for f in fwd]
    o_b = [b.overhead for b in bwd_of]
    tau = size(tangent)
    o_b[n - 1] = max(tau + loss.overhead - delta[n - 1], tau + bwd_of[n - 1].overhead)
    kept = x[n] if act[n] in protected else 0
    chain = Chain(
        fwd_time=tuple(f.time for f in fwd),
        bwd_time=tuple(b.time for b in bwd_of[:-1]) + (loss.time + bwd_of[-1].time,),
        x=tuple(x), xbar=tuple(x[1:]), delta=tuple(delta),
        fwd_overhead=tuple(o_f), bwd_overhead=tuple(o_b), kept_after_loss=kept,
    )
    # memory while the tail runs (its nodes in order, then the partial gradients freed), from
    # the kept model output and the input gradients
    need = tail_peak(graph, ([act[n]] if kept else []) + list(grad[0]), tail)
    bwd = tuple((b.id,) for b in bwd_of[:-1]) + ((loss.id, bwd_of[-1].id),)
    return GraphChain(chain, tuple(f.id for f in fwd), bwd, tuple(act), tuple(grad), tangent,
                      tuple(nd.id for nd in tail), protected, need), ""


def tail_peak(graph, alive, tail) -> int:
    """Peak memory while the ``tail`` nodes run in order from the data ``alive`` (the
    simulator's step rule, :class:`~hiremate.ir.tracker.MemoryTracker`)."""
    from hiremate.ir.tracker import MemoryTracker

    tracker = MemoryTracker(graph, alive=alive)
    for nd in tail:
        tracker.compute(nd.id)
    return tracker.peak


def ops_to_schedule(gc: GraphChain, ops: Sequence[ChainOp]):
    """Turn a valid chain sequence into a graph :data:`~hiremate.ir.schedule.Schedule`: each
    operation computes its nodes, then deletes what the chain model frees (never the model
    outputs); the tail nodes run at the end."""
    from hiremate.ir.schedule import Compute, Delete

    chain = gc.chain
    state = initial_state(chain)
    steps: list = []

    def drop(ids) -> None:
        steps.extend(Delete(d) for d in ids if d is not None and d not in gc.protected)

    for op in ops:
        state, _, freed = chain_step(chain, state, op)
        k = op.stage
        if op.kind is OpKind.B:
            steps.extend(Compute(node) for node in gc.bwd[k - 1])
            if k == chain.n:
                drop(gc.bwd_internal)
        else:
            steps.append(Compute(gc.fwd[k - 1]))
        for what, j in freed:
            if what == "delta":
                drop(gc.grad[j])
            elif j >= 1:
                drop([gc.act[j]])
    if state.grad != 0:
        raise InvalidScheduleError("the chain sequence does not compute δ^0, so it is no "
                                   "complete forward and backward; check it with simulate_chain")
    steps.extend(Compute(node) for node in gc.tail)
    if gc.tail:
        drop(gc.grad[0])
    return tuple(steps)


class ChainGraphSolver(abc.ABC):
    """Base of the solvers that schedule chain-shaped graphs through a :class:`Chain`.

    Subclasses give ``name``, ``solve_chain(chain, budget) -> ChainSolution`` and
    ``chain_min_budget(chain) -> float`` (the smallest budget ``solve_chain`` accepts).
    """

    name = "chain"

    def applicable(self, graph) -> bool:
        return graph_chain(graph)[0] is not None

    def min_budget(self, graph) -> int:
        """Smallest budget (bytes) this solver can schedule ``graph`` in."""
        gc = self._structure(graph)
        return max(int(math.ceil(self.chain_min_budget(gc.chain) - 1e-9)), gc.tail_need)

    def schedule(self, graph, budget: int):
        """A schedule of ``graph`` whose simulated peak is at most ``budget`` bytes."""
        from hiremate.errors import InfeasibleBudgetError
        from hiremate.units import fmt_bytes

        gc = self._structure(graph)
        need = max(int(math.ceil(self.chain_min_budget(gc.chain) - 1e-9)), gc.tail_need)
        if budget < need:
            raise InfeasibleBudgetError(
                f"{self.name}: budget {fmt_bytes(budget)} is below the {fmt_bytes(need)} this "
                f"chain of {gc.chain.n} stages needs; raise the budget or use a solver that "
                "recomputes more", min_budget=need)
        try:
            sol = self.solve_chain(gc.chain, budget)
        except ValueError as exc:
            raise InfeasibleBudgetError(f"{self.name}: {exc}", min_budget=need) from exc
        return ops_to_schedule(gc, sol.ops)

    def _structure(self, graph) -> GraphChain:
        from hiremate.errors import SolverError

        gc, why = graph_chain(graph)
        if gc is None:
            raise SolverError(f"{self.name} schedules chain-shaped graphs only: {why}; use a "
                              "general-graph solver (e.g. H-ILP) for this graph")
        return gc

    @abc.abstractmethod
    def solve_chain(self, chain: Chain, budget: float) -> ChainSolution:
        """The operation sequence for ``chain`` within ``budget``."""

    @abc.abstractmethod
    def chain_min_budget(self, chain: Chain) -> float:
        """The smallest budget :meth:`solve_chain` accepts for ``chain``."""
