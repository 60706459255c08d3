"""The top graph of the hierarchical H-ILP: blocks contracted into ``F_j`` / ``B_j`` nodes, and
what each option of a block costs at the top level (HiRemate, section 3.2.2 and appendix B).

Why a module of its own: the contraction and the option figures are what link the top-level
MILP (:mod:`hiremate.solvers.hilp.hier`) to the full graph; the model reads them only.

The top graph (:func:`top_graph`) has one compute node per block forward ``F_j`` and per block
backward ``B_j``, the loss node, and the top-level (tail) backward nodes. Its data nodes are
the *interface* values of the full graph: those produced by one top node and read by another,
plus the model outputs and the final gradients. A block's internal values are not data nodes;
what its forward keeps for its backward is the block's *phantom*, whose size depends on the
option. A top node's inputs are the union over its block's options; what each option's part
reads is recorded as well (``TopGraph.opt_reads``), for the option-specific dependencies of
appendix B.1.2.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from hiremate.errors import SolverError
from hiremate.ir.graph import ComputeNode, DataNode, Graph, NodeKind
from hiremate.ir.option import Option
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import trace
from hiremate.ir.tracker import counted_sizes
from hiremate.solvers.hilp.model import gcd_unit

if TYPE_CHECKING:
    from hiremate.ir.blocks import Block, TopProblem


#: a step profile: (memory above the rest while the step runs, interface values the part is done
#: with: top-level inputs read for the last time, and in a forward part block outputs made and
#: read for the last time; freed by then when the level above frees them after the node)
Profile = tuple[tuple[int, frozenset], ...]


@dataclass(frozen=True)
class OptionCost:
    """One option as the top level sees it (bytes and seconds, full-graph compute ids)."""

    fwd_time: float
    bwd_time: float
    fwd_peak: int   # memory above everything else alive while the forward part runs
    bwd_peak: int   # the same for the backward part, beyond the block's phantom and grads in
    phantom: int
    fwd_seq: tuple[int, ...]
    bwd_seq: tuple[int, ...]
    fwd_profile: Profile = ()
    bwd_profile: Profile = ()
    solver: str = ""
    #: the backward part reads no value of the block's forward but its outputs (it recomputes
    #: what it needs) and the forward part keeps nothing else: the option's forward and
    #: backward need not pair up (``standalone`` in :func:`build_hier_model`)
    standalone: bool = False


def _prune(entries: list[tuple[int, frozenset]]) -> Profile:
    """Keep, per set of freed values, the highest memory; drop an entry that another with no
    more credits and at least as much memory covers. The sets grow along a part (a value done
    with stays so), hence at most ``interface values + 1`` entries remain."""
    best: dict[frozenset, int] = {}
    for w, fr in entries:
        best[fr] = max(best.get(fr, w), w)
    items = sorted(best.items(), key=lambda kv: (len(kv[0]), -kv[1]))
    kept: list[tuple[int, frozenset]] = []
    for fr, w in items:
        if not any(w2 >= w and f2 <= fr for w2, f2 in kept):
            kept.append((w, fr))
    return tuple(kept)


@dataclass
class TopGraph:
    """The top graph and what links it to the blocks and the full graph."""

    graph: Graph
    kind: list[str]            # per top node: "F", "B", "loss" or "tail"
    block: list[int]           # block index for F/B nodes, -1 otherwise
    full: list[int]            # full compute id for loss/tail nodes, -1 otherwise
    costs: list[list[OptionCost]]  # per block
    data_full: list[int]       # top data id -> full data id
    #: per top node, per option of its block: the top data ids that option's part reads
    #: (empty for loss and tail nodes); None: every option reads them all (the union model)
    opt_reads: list[list[frozenset]] | None = None

    def fwd_node(self, j: int) -> int:
        return self.kind.index("F") + j

    def sequence(self, k: int, option: int | None) -> list[int]:
        """Full-graph compute ids that top node ``k`` (with ``option``) stands for."""
        if self.kind[k] == "F":
            return list(self.costs[self.block[k]][option].fwd_seq)
        if self.kind[k] == "B":
            return list(self.costs[self.block[k]][option].bwd_seq)
        return [self.full[k]]


def option_costs(block: "Block", option: Option) -> OptionCost:
    """Top-level figures of ``option`` from its step profile on the block's CD-graph.

    Forward, per step: the memory of the part (outputs and internal values; the block's inputs
    are sources there, so not counted), which is what the full graph adds while it runs.
    Backward, per step: ``memory - gradients in still alive``, minus the phantom and minus the
    outputs the part does not recompute (the level above holds the phantom and all gradients
    in; an output the part does not recompute is either alive above, or absent in the full
    graph too). Each step also lists the interface values (full ids) the part is done with
    before it, inputs read for the last time and, in the forward part, outputs made and read
    for the last time: the B.3 correction credits them when the level above frees them after
    the node (for an output, that is when the level above neither keeps it nor reads it later
    in the phase; the simulator then frees it after its last use inside the part)."""
    sub = block.graph
    dmap = block.data_map
    counted = counted_sizes(sub)
    grads_in = set(sub.nodes[sub.loss].outputs)
    outs = set(sub.outputs)
    parts = (list(option.fwd), list(option.bwd))
    # last compute-step index that touches each value, per part (full data ids): reads, and
    # in the forward part also the making of a block output (B.3's output side: an output the
    # level above frees after the node goes once the part has made it and read it last)
    last: list[dict[int, int]] = []
    for p, part in enumerate(parts):
        lr: dict[int, int] = {}
        for i, step in enumerate(part):
            if isinstance(step, Compute):
                node = sub.nodes[step.node]
                made = [d for d in node.outputs if d in outs] if p == 0 else []
                for d in (*node.inputs, *made):
                    lr[dmap[d]] = i
        last.append(lr)

    def freed(p: int, i: int, strict: bool) -> frozenset:
        return frozenset(d for d, li in last[p].items() if (li < i if strict else li <= i))

    # the simulator's step rule over forward part, loss, backward part
    cut = len(parts[0])
    tr = trace(sub, tuple(parts[0]) + (Compute(sub.loss),) + tuple(parts[1]))
    fwd: list[tuple[int, frozenset]] = []
    for i, step in enumerate(parts[0]):
        if isinstance(step, Compute):
            fwd.append((tr.during[i], freed(0, i, True)))
        fwd.append((tr.after[i], freed(0, i, False)))
    held = tr.after[cut - 1] if cut else tr.start
    g_alive = tr.after[cut] - held  # the gradients in, made by the loss
    bwd_raw: list[tuple[int, frozenset]] = []
    recomputed: set[int] = set()
    made_bwd: set[int] = set()
    reads_fwd = False  # the backward part reads a forward value it did not make (not an output)
    for i, step in enumerate(parts[1]):
        j = cut + 1 + i
        if isinstance(step, Compute):
            node = sub.nodes[step.node]
            reads_fwd = reads_fwd or any(
                d not in made_bwd and d not in outs and sub.data[d].producer is not None
                and sub.data[d].producer != sub.loss
                and sub.nodes[sub.data[d].producer].kind is NodeKind.FWD for d in node.inputs)
            made_bwd.update(node.outputs)
            recomputed.update(d for d in node.outputs if d in outs)
            bwd_raw.append((tr.during[j] - g_alive, freed(1, i, True)))
        else:
            g_alive -= sum(counted[d] for d in tr.freed[j] if d in grads_in)
        bwd_raw.append((tr.after[j] - g_alive, freed(1, i, False)))
    out_b = sum(counted[d] for d in outs)
    phantom = max(held - out_b, 0)
    less = phantom + sum(counted[d] for d in outs - recomputed)
    bwd = [(max(w - less, 0), fr) for w, fr in bwd_raw]
    fwd_p, bwd_p = _prune(fwd), _prune(bwd)
    return OptionCost(
        fwd_time=option.fwd_time, bwd_time=option.bwd_time,
        fwd_peak=max((w for w, _ in fwd_p), default=0),
        bwd_peak=max((w for w, _ in bwd_p), default=0), phantom=phantom,
        fwd_seq=tuple(block.sequence(option.fwd)), bwd_seq=tuple(block.sequence(option.bwd)),
        fwd_profile=fwd_p, bwd_profile=bwd_p, solver=option.solver,
        standalone=phantom == 0 and held == out_b and not reads_fwd)


#: a phantom-free option of the menu whose forward takes at most this many times the plain
#: forward's stands in for the checkpoint option (each option more enlarges the top MILP)
CHECKPOINT_SLACK = 1.5


def checkpoint_options(block: "Block") -> list[Option]:
    """The block's *checkpoint* option, unless its menu has a phantom-free option whose
    forward takes at most :data:`CHECKPOINT_SLACK` times the plain forward's: the forward
    keeps only the outputs, the backward recomputes the whole forward first. H-ILP's forward
    always leaves its option's phantom until the block's backward (constraints 7-8), so a
    forward run for the block's outputs alone (what rk-Rotor's ``Fc`` operation does) needs a
    phantom-free option. The menu's own phantom-free option, when there is one, is often its
    least-memory schedule, whose forward recomputes inside the block (several times the plain
    forward's time); with only that one, every such forward pays its price or keeps a phantom
    it does not need until the backward."""
    from hiremate.solvers.menu import option_from_schedule
    from hiremate.ir.sequence import sequence_to_schedule

    sub = block.graph
    fwd = [n.id for n in sub.fwd_nodes]
    plain = sum(sub.nodes[k].time for k in fwd)  # the checkpoint option's forward time
    if any(o.phantom == 0 and o.fwd_time <= CHECKPOINT_SLACK * plain for o in block.options):
        return []
    seq = fwd + [sub.loss] + fwd + [n.id for n in sub.bwd_nodes]
    try:
        return [option_from_schedule(sub, sequence_to_schedule(sub, seq), "checkpoint")]
    except Exception:  # an invalid sequence (should not happen): go without the option
        return []


def top_graph(problem: "TopProblem", checkpoint: bool = True,
              option_deps: bool = True) -> TopGraph:
    """Contract the full graph's blocks into ``F_j`` / ``B_j`` nodes (see module docstring);
    ``checkpoint`` adds each block's checkpoint option where its menu lacks one;
    ``option_deps`` records what each option reads (``TopGraph.opt_reads``), for the
    option-specific dependencies of :func:`build_hier_model`."""
    graph = problem.graph
    blocks = problem.blocks
    L = len(blocks)
    costs = [[option_costs(b, o) for o in b.options + (checkpoint_options(b) if checkpoint else [])]
             for b in blocks]
    if any(not c for c in costs):
        raise SolverError("hierarchical H-ILP needs at least one option per block")
    # top node "names": ("F", j), ("loss",), ("B", j), ("tail", id)
    owner: dict[int, tuple] = {graph.loss: ("loss", -1)}
    for j, b in enumerate(blocks):
        owner.update({n: ("F", j) for n in b.fwd})
        owner.update({n: ("B", j) for n in b.bwd})
    owner.update({n: ("tail", n) for n in problem.tail})
    outs_of = [{b.data_map[d] for d in b.graph.outputs} for b in blocks]

    def reads(seqs: Sequence[Sequence[int]], own: set[tuple], allowed: set[int]) -> set[int]:
        """Non-source data read by any of ``seqs`` before the sequence produces it, produced
        by a top node outside ``own`` (or in ``allowed``: a block's outputs read by its
        backward; the block's other forward values are its phantom)."""
        found: set[int] = set()
        for seq in seqs:
            made: set[int] = set()
            for nid in seq:
                node = graph.nodes[nid]
                for d in node.inputs:
                    p = graph.data[d].producer
                    if p is None or d in made:
                        continue
                    if owner[p] not in own or d in allowed:
                        found.add(d)
                made.update(node.outputs)
        return found

    names: list[tuple] = [("F", j) for j in range(L)] + [("loss", -1)]
    names += [("B", j) for j in range(L)] + [("tail", n) for n in problem.tail]
    inputs: dict[tuple, set[int]] = {}
    for j in range(L):
        inputs[("F", j)] = reads([c.fwd_seq for c in costs[j]], {("F", j)}, set())
        inputs[("B", j)] = reads([c.bwd_seq for c in costs[j]], {("F", j), ("B", j)},
                                 outs_of[j])
    per_option: dict[tuple, list[set[int]]] = {}
    for j in range(L):
        per_option[("F", j)] = [reads([c.fwd_seq], {("F", j)}, set()) for c in costs[j]]
        per_option[("B", j)] = [reads([c.bwd_seq], {("F", j), ("B", j)}, outs_of[j])
                                for c in costs[j]]
    for nm in (("loss", -1),) + tuple(("tail", n) for n in problem.tail):
        nid = graph.loss if nm[0] == "loss" else nm[1]
        inputs[nm] = {d for d in graph.nodes[nid].inputs if graph.data[d].producer is not None}
    # interface data: read across top nodes, model outputs, final gradients
    keep = set(graph.outputs) | set(graph.final_data)
    iface = set().union(*inputs.values()) | {d for d in keep if graph.data[d].producer is not None}
    # order: forward nodes as the blocks come, then the backward side topologically
    deps: dict[tuple, set[tuple]] = {nm: set() for nm in names}
    for nm, ins in inputs.items():
        for d in ins:
            src = owner[graph.data[d].producer]
            if src != nm:
                deps[nm].add(src)
    for j in range(L):
        if any(s[0] != "F" or s[1] >= j for s in deps[("F", j)]):
            raise SolverError(f"block {j}'s forward reads a later block: the blocks are not in "
                              "a topological order")
    back = [nm for nm in names if nm[0] in ("B", "tail")]
    key = {nm: min(blocks[nm[1]].bwd, default=10**9) if nm[0] == "B" else nm[1] for nm in back}
    placed: set[tuple] = set(names[:L + 1])
    heap = [(key[nm], nm) for nm in back if deps[nm] <= placed]
    heapq.heapify(heap)
    queued = {nm for _, nm in heap}
    order: list[tuple] = []
    while heap:
        _, nm = heapq.heappop(heap)
        order.append(nm)
        placed.add(nm)
        for other in back:
            if other not in queued and deps[other] <= placed:
                heapq.heappush(heap, (key[other], other))
                queued.add(other)
    if len(order) != len(back):
        raise SolverError("the blocks' backward parts depend on each other in a cycle; the "
                          "hierarchical H-ILP needs a partition whose contraction is acyclic")
    names = names[:L + 1] + order
    tid = {nm: i for i, nm in enumerate(names)}
    data_full = sorted(iface)
    did = {d: i for i, d in enumerate(data_full)}
    produced: dict[tuple, list[int]] = {nm: [] for nm in names}
    for d in data_full:
        produced[owner[graph.data[d].producer]].append(did[d])
    data = [DataNode(i, graph.data[d].name, graph.data[d].kind, graph.data[d].shape,
                     graph.data[d].dtype, graph.data[d].size,
                     tid[owner[graph.data[d].producer]]) for i, d in enumerate(data_full)]
    nodes = []
    for i, nm in enumerate(names):
        ins = tuple(sorted(did[d] for d in inputs[nm]))
        outs = tuple(sorted(produced[nm]))
        if nm[0] in ("F", "B"):
            kind = NodeKind.FWD if nm[0] == "F" else NodeKind.BWD
            nodes.append(ComputeNode(i, f"{nm[0]}{nm[1]}", kind, ins, outs))
        else:
            src = graph.nodes[graph.loss if nm[0] == "loss" else nm[1]]
            nodes.append(ComputeNode(i, src.name, src.kind, ins, outs, src.time, src.overhead))
    top = Graph(nodes, data, [did[d] for d in graph.outputs if d in did])
    opt_reads = None
    if option_deps:
        opt_reads = [[frozenset(did[d] for d in ins) for ins in per_option[nm]]
                     if nm in per_option else [] for nm in names]
    return TopGraph(top, [nm[0] for nm in names], [nm[1] if nm[0] in ("F", "B") else -1
                                                   for nm in names],
                    [graph.loss if nm[0] == "loss" else nm[1] if nm[0] == "tail" else -1
                     for nm in names], costs, data_full, opt_reads)


# -- figures of a top graph's model and solution --------------------------------------------------
def gcd_unit_top(top: TopGraph) -> int:
    """Largest integer dividing every memory figure of ``top``'s model (interface sizes, node
    overheads, phantoms, option step peaks): a memory unit under which every constraint
    coefficient is an integer, as CP-SAT needs, and the memory rows stay exact."""
    g = gcd_unit(top.graph)
    for costs in top.costs:
        for oc in costs:
            for w in (oc.phantom, *(w for w, _ in oc.fwd_profile),
                      *(w for w, _ in oc.bwd_profile)):
                g = math.gcd(g, int(w))
    return max(g, 1)


def block_solvers(top: TopGraph, steps) -> list[str]:
    """For each block, the solver(s) of the options its backward ran with."""
    used: list[set[str]] = [set() for _ in top.costs]
    for _, k, o in steps:
        if top.kind[k] == "B":
            used[top.block[k]].add(top.costs[top.block[k]][o].solver)
    return ["+".join(sorted(u)) or "none" for u in used]


def store_all_objective(top: TopGraph) -> float:
    """Time of running every top node once with each block's first option (a test helper:
    with one store-all option per block this is the full graph's total time)."""
    total = 0.0
    for k, kind in enumerate(top.kind):
        if kind == "F":
            total += top.costs[top.block[k]][0].fwd_time
        elif kind == "B":
            total += top.costs[top.block[k]][0].bwd_time
        else:
            total += top.graph.nodes[k].time
    return float(total)
