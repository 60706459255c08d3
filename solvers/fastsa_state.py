"""FastSA's annealing state: a slotted node sequence with incremental lifetimes and memory.

The sequence is a fixed array of ``T`` slots, each holding a node index or ``NOP`` (-1)
(``papers/fastsa-simulated-annealing.txt`` section 2.2). For every value it keeps the sorted
slots where it is produced and where it is read; a copy produced at slot ``p`` lives on
``[p, e]`` where ``e`` is its last reader before the next production (``p`` if none), or the
last slot for values that must survive (model outputs, final gradients). The memory held at
slot ``t`` (the sum of the sizes of the copies alive there, plus the node's overhead) is in an
:class:`AddMaxSegmentTree`, so the peak is read at its root.

Adding and removing a node are exact inverses, so a rejected mutation is undone by applying
the opposite one. The memory at a slot that holds a node equals the simulator's memory while
that node runs (alive values + all its outputs + its overhead), which tests check.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from hiremate.solvers.fastsa_segtree import AddMaxSegmentTree

NOP = -1


class NodeTable:
    """Nodes the annealer places: inputs/outputs (non-source data ids), cost, overhead, flags.

    ``movable_only[x]``: the node must appear exactly once (loss, backward, output producers);
    ``after_loss[x]``: it may not be placed before the loss slot (it contains backward work).
    ``members[x]``: the original compute nodes it runs, in order (several when grouped).
    """

    def __init__(self) -> None:
        self.ins: list[tuple[int, ...]] = []
        self.outs: list[tuple[int, ...]] = []
        self.cost: list[float] = []
        self.overhead: list[int] = []
        self.movable_only: list[bool] = []
        self.after_loss: list[bool] = []
        self.members: list[tuple[int, ...]] = []

    def add(self, ins, outs, cost, overhead, movable_only, after_loss, members) -> int:
        self.ins.append(tuple(ins))
        self.outs.append(tuple(outs))
        self.cost.append(cost)
        self.overhead.append(overhead)
        self.movable_only.append(movable_only)
        self.after_loss.append(after_loss)
        self.members.append(tuple(members))
        return len(self.ins) - 1

    def __len__(self) -> int:
        return len(self.ins)


class SlotState:
    """Slots, per-value production/use lists, the memory tree and the total cost."""

    def __init__(self, table: NodeTable, order: list[int], n_data: int, sizes: list[int],
                 kept: list[bool], loss_node: int, gap: int = 3):
        self.table = table
        self.T = gap * (len(order) + 1)
        self.end = self.T - 1
        self.seq = [NOP] * self.T
        self.prods: list[list[int]] = [[] for _ in range(n_data)]
        self.uses: list[list[int]] = [[] for _ in range(n_data)]
        self.size = sizes
        self.kept = kept
        self.tree = AddMaxSegmentTree(self.T)
        self.cost = 0.0
        self.loss_slot = -1
        for i, x in enumerate(order):
            t = gap * (i + 1)
            if x == loss_node:
                self.loss_slot = t
            self.add(x, t)

    # -- lifetimes ---------------------------------------------------------------------------
    def copy_end(self, d: int, p: int) -> int:
        """Last slot of the copy of ``d`` produced at slot ``p``."""
        prods = self.prods[d]
        k = bisect_right(prods, p)
        if k < len(prods):
            nxt = prods[k]
        elif self.kept[d]:
            return self.end
        else:
            nxt = self.T
        uses = self.uses[d]
        j = bisect_left(uses, nxt) - 1
        if j >= 0 and uses[j] > p:
            return uses[j]
        return p

    # -- validity ----------------------------------------------------------------------------
    def can_add(self, x: int, t: int) -> bool:
        """Every input of ``x`` is produced before slot ``t`` (and backward work after loss)."""
        if self.table.after_loss[x] and t <= self.loss_slot:
            return False
        prods = self.prods
        for d in self.table.ins[x]:
            p = prods[d]
            if not p or p[0] >= t:
                return False
        return True

    def can_remove(self, x: int, t: int, extra: int = -1) -> bool:
        """Removing ``x`` from slot ``t`` leaves every read of its outputs satisfied.

        ``extra`` is a slot where ``x`` is about to be placed (a move), counted as a production.
        """
        for d in self.table.outs[x]:
            prods = self.prods[d]
            k = bisect_left(prods, t)
            if k > 0 or (0 <= extra < t):
                continue
            nxt = prods[k + 1] if k + 1 < len(prods) else self.T
            if extra > t and extra < nxt:
                nxt = extra
            elif nxt == self.T and self.kept[d]:
                return False
            uses = self.uses[d]
            j = bisect_right(uses, t)
            if j < len(uses) and uses[j] < nxt:
                return False
        return True

    # -- mutations (exact inverses of each other) --------------------------------------------
    def add(self, x: int, t: int) -> None:
        self.seq[t] = x
        table = self.table
        tree_add = self.tree.add
        size = self.size
        copy_end = self.copy_end
        for d in table.ins[x]:
            s = size[d]
            if s:
                # a new reader at t extends the copy that covers t up to t, if it ended before
                prods = self.prods[d]
                e0 = copy_end(d, prods[bisect_left(prods, t) - 1])
                if t > e0:
                    tree_add(e0 + 1, t + 1, s)
            insort(self.uses[d], t)
        for d in table.outs[x]:
            s = size[d]
            prods = self.prods[d]
            k = bisect_left(prods, t)
            if s and k:
                p = prods[k - 1]
                e0 = copy_end(d, p)
                prods.insert(k, t)
                if e0 >= t:  # the earlier copy now ends at its last reader before t
                    e1 = copy_end(d, p)
                    tree_add(e1 + 1, e0 + 1, -s)
            else:
                prods.insert(k, t)
            if s:
                tree_add(t, copy_end(d, t) + 1, s)
        ov = table.overhead[x]
        if ov:
            tree_add(t, t + 1, ov)
        self.cost += table.cost[x]

    def remove(self, x: int, t: int) -> None:
        self.seq[t] = NOP
        table = self.table
        tree_add = self.tree.add
        size = self.size
        copy_end = self.copy_end
        for d in table.outs[x]:
            s = size[d]
            prods = self.prods[d]
            k = bisect_left(prods, t)
            if s:
                tree_add(t, copy_end(d, t) + 1, -s)
                if k:
                    p = prods[k - 1]
                    e0 = copy_end(d, p)
                    del prods[k]
                    e1 = copy_end(d, p)
                    if e1 > e0:
                        tree_add(e0 + 1, e1 + 1, s)
                    continue
            del prods[k]
        for d in table.ins[x]:
            s = size[d]
            uses = self.uses[d]
            if s:
                prods = self.prods[d]
                p = prods[bisect_left(prods, t) - 1]
                e0 = copy_end(d, p)
                del uses[bisect_left(uses, t)]
                if e0 == t:  # t was the last reader of that copy: it now ends earlier
                    e1 = copy_end(d, p)
                    tree_add(e1 + 1, e0 + 1, -s)
            else:
                del uses[bisect_left(uses, t)]
        ov = table.overhead[x]
        if ov:
            tree_add(t, t + 1, -ov)
        self.cost -= table.cost[x]

    # -- views -------------------------------------------------------------------------------
    @property
    def peak(self) -> int:
        return self.tree.max()

    def order(self) -> list[int]:
        """Placed node indices, in slot order."""
        return [x for x in self.seq if x != NOP]
