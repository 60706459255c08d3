"""FastSA's annealing state: a slotted node sequence with incremental lifetimes and memory.

The sequence is a fixed array of ``T`` slots, each holding a node index or ``NOP`` (-1)
(FastSA paper, section 2.2). For every value it keeps the sorted
slots where it is produced and where it is read; a copy produced at slot ``p`` lives on
``[p, e]`` where ``e`` is its last reader before the next production (``p`` if none), or the
last slot for values that must survive (model outputs, final gradients). The memory held at
slot ``t`` (the sum of the sizes of the copies alive there, plus the node's overhead) is in an
:class:`AddMaxSegmentTree`, so the peak is read at its root.

Adding and removing a node are exact inverses, so a rejected mutation is undone by applying
the opposite one. The memory at a slot that holds a node equals the simulator's memory while
that node runs (alive values + all its outputs + its overhead), which tests check.

Why it evaluates before it applies: the annealer rejects most mutations, so applying a
mutation and undoing it wasted most of its time. A mutation is a handful of range additions
("deltas") to the memory profile; :meth:`SlotState.add_deltas` / :meth:`remove_deltas` list
them without touching the state, :meth:`peak_bound` gives a lower bound of the new peak in a few
Python operations (the current peak slot plus the deltas that cover it), :meth:`peak_with` the
exact new peak (a NumPy window), and :meth:`commit_add` / :meth:`commit_remove` apply them. The
profile is a NumPy array rather than the pure-Python add-max segment tree
(:mod:`hiremate.testing.segtree`, kept as a reference): a slice addition costs the same
whatever its length, and the peak is refreshed once per applied mutation.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

import numpy as np

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


Delta = tuple[int, int, int]
"""``(lo, hi, s)``: add ``s`` bytes to the memory of every slot in ``[lo, hi)``."""


def compact(deltas: list[Delta]) -> list[Delta]:
    """The same memory change as disjoint ranges with non-zero values, adjacent equal ones
    merged. A move's two halves mostly cancel (the new copy replaces the old one), so this
    leaves fewer ranges to apply and a tighter :meth:`SlotState.peak_bounds` upper bound."""
    if len(deltas) < 2:
        return deltas
    ev: dict[int, int] = {}
    for a, b, s in deltas:
        ev[a] = ev.get(a, 0) + s
        ev[b] = ev.get(b, 0) - s
    out: list[Delta] = []
    cur = 0
    start = 0
    for pos in sorted(ev):
        step = ev[pos]
        if not step:
            continue
        if cur:
            out.append((start, pos, cur))
        cur += step
        start = pos
    return out


class SlotState:
    """Slots, per-value production/use lists, the memory profile, its peak and the total cost."""

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
        # inputs/outputs that hold memory, each once (a node may read one value twice)
        self.sized_ins = [tuple(dict.fromkeys(d for d in ins if sizes[d])) for ins in table.ins]
        self.sized_outs = [tuple(dict.fromkeys(d for d in outs if sizes[d]))
                           for outs in table.outs]
        self.out_bytes = [sum(sizes[d] for d in outs) for outs in self.sized_outs]
        producer = {d: x for x in range(len(table)) for d in table.outs[x]}
        readers: list[set[int]] = [set() for _ in range(len(table))]
        for y in range(len(table)):
            for d in table.ins[y]:
                if d in producer:
                    readers[producer[d]].add(y)
        self.readers = [tuple(sorted(r)) for r in readers]
        self.first_cache = [-1] * len(table)
        self.pin = [-1] * len(table)  # slot of a pinned first copy, -1: none (pin_first_copies)
        self.mem = np.zeros(self.T, dtype=np.int64)
        self.peak = 0          # max(mem), kept current by every commit
        self.peak_at = 0       # a slot where mem reaches the peak
        self.new_at = 0        # set by peak_with
        self.cost = 0.0
        self.loss_slot = -1
        for i, x in enumerate(order):
            t = gap * (i + 1)
            if x == loss_node:
                self.loss_slot = t
            self.add(x, t)

    # -- lifetimes ---------------------------------------------------------------------------
    def copy_end(self, d: int, p: int) -> int:
        """Last slot of the copy of ``d`` produced at slot ``p`` (``p`` need not be in the
        production list: then the copy that a production at ``p`` would start)."""
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

    def pin_first_copies(self, nodes) -> None:
        """Pin the first copy of each of ``nodes`` at its slot: it may neither move nor go, and
        no copy may be added before it. Random nodes are pinned: their first runs then keep the
        order of the initial sequence (the graph's, which the simulator requires)."""
        for x in nodes:
            self.pin[x] = self.seq.index(x)
            self.first_cache[x] = -1

    # -- validity ----------------------------------------------------------------------------
    def can_add(self, x: int, t: int) -> bool:
        """Every input of ``x`` is produced before slot ``t`` (and backward work after loss),
        and ``t`` comes after the pinned first copy of ``x``, if any."""
        if self.table.after_loss[x] and t <= self.loss_slot or t <= self.pin[x]:
            return False
        prods = self.prods
        for d in self.table.ins[x]:
            p = prods[d]
            if not p or p[0] >= t:
                return False
        return True

    def first_slot(self, x: int) -> int:
        """The first slot where ``x`` may be added (``can_add(x, t)`` iff ``t >=`` it).

        Cached in ``first_cache`` (-1: unknown); a commit that places, removes or moves a node
        forgets the entries of the nodes that read its outputs.
        """
        lo = self.first_cache[x]
        if lo >= 0:
            return lo
        lo = self.loss_slot + 1 if self.table.after_loss[x] else 0
        if self.pin[x] >= lo:
            lo = self.pin[x] + 1
        prods = self.prods
        for d in self.table.ins[x]:
            p = prods[d]
            if not p:
                return self.T
            if p[0] >= lo:
                lo = p[0] + 1
        self.first_cache[x] = lo
        return lo

    def _forget_first(self, x: int) -> None:
        cache = self.first_cache
        for y in self.readers[x]:
            cache[y] = -1

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

    # -- deltas of a mutation, without applying it -------------------------------------------
    # The lifetime rule of ``copy_end`` is inlined below (this is the annealer's hot path).
    def add_deltas(self, x: int, t: int) -> list[Delta]:
        """Memory changes of placing ``x`` at the free slot ``t`` (``can_add`` must hold).

        All of them lie on slots ``<= t`` except the new copies of outputs read after ``t``,
        which only add memory; the outputs' negative changes lie on slots ``< t``.
        """
        out: list[Delta] = []
        prods_of, uses_of, size, kept = self.prods, self.uses, self.size, self.kept
        T = self.T
        for d in self.sized_ins[x]:
            # the copy covering t now lives at least up to t
            prods = prods_of[d]
            k = bisect_left(prods, t)
            p = prods[k - 1]
            if k < len(prods):
                nxt = prods[k]
            elif kept[d]:
                continue  # lives to the end already
            else:
                nxt = T
            uses = uses_of[d]
            j = bisect_left(uses, nxt) - 1
            e0 = uses[j] if j >= 0 and uses[j] > p else p
            if t > e0:
                out.append((e0 + 1, t + 1, size[d]))
        for d in self.sized_outs[x]:
            s = size[d]
            prods = prods_of[d]
            k = bisect_left(prods, t)
            uses = uses_of[d]
            if k < len(prods):
                nxt = prods[k]
                last_copy = False
            else:
                nxt = T
                last_copy = kept[d]
            j = bisect_left(uses, nxt) - 1
            last_use = uses[j] if j >= 0 else -1   # last reader before the next production
            if k:
                p = prods[k - 1]
                if last_copy or last_use > t:
                    # the earlier copy covered t and the readers up to the next production; it
                    # now ends at its last reader before t (or at p) and the new copy takes
                    # over from t with the same end: memory drops on (e1, t) only
                    i = bisect_left(uses, t) - 1
                    e1 = uses[i] if i >= 0 and uses[i] > p else p
                    if e1 + 1 < t:
                        out.append((e1 + 1, t, -s))
                    continue
            # the new copy lives from t to its last reader (no earlier copy reached t)
            if last_copy:
                out.append((t, T, s))
            else:
                out.append((t, (last_use if last_use > t else t) + 1, s))
        ov = self.table.overhead[x]
        if ov:
            out.append((t, t + 1, ov))
        return out

    def remove_deltas(self, x: int, t: int) -> list[Delta] | None:
        """Memory changes of removing ``x`` from slot ``t``, or None when the removal is invalid
        (``can_remove(x, t)`` is false: some reader of an output would lose its copy)."""
        out: list[Delta] = []
        prods_of, uses_of, size, kept = self.prods, self.uses, self.size, self.kept
        T = self.T
        for d in self.table.outs[x]:
            s = size[d]
            prods = prods_of[d]
            k = bisect_left(prods, t)
            uses = uses_of[d]
            if k + 1 < len(prods):
                nxt = prods[k + 1]
                last_copy = False
            else:
                nxt = T
                last_copy = kept[d]
            j = bisect_left(uses, nxt) - 1
            last_use = uses[j] if j >= 0 else -1
            if k:
                # the earlier copy (ending at e0) now serves the removed copy's readers: memory
                # rises on (e0, t) when the removed copy was read or must survive
                p = prods[k - 1]
                if last_copy or last_use > t:
                    i = bisect_left(uses, t) - 1
                    e0 = uses[i] if i >= 0 and uses[i] > p else p
                    if s and e0 + 1 < t:
                        out.append((e0 + 1, t, s))
                    continue
            elif last_copy or last_use > t:
                return None  # the only copy before a read (or a value that must survive)
            if s:
                out.append((t, T if last_copy else (last_use if last_use > t else t) + 1, -s))
        for d in self.sized_ins[x]:
            prods = prods_of[d]
            k = bisect_left(prods, t)
            p = prods[k - 1]
            if k < len(prods):
                nxt = prods[k]
            elif kept[d]:
                continue  # the last copy of a value that must survive keeps its slots
            else:
                nxt = T
            uses = uses_of[d]
            j = bisect_left(uses, nxt) - 1
            if uses[j] == t:
                # t was the last reader of that copy: it now ends at the reader before t
                i = bisect_left(uses, t) - 1
                e1 = uses[i] if i >= 0 and uses[i] > p else p
                out.append((e1 + 1, t + 1, -size[d]))
        ov = self.table.overhead[x]
        if ov:
            out.append((t, t + 1, -ov))
        return out

    def move_deltas(self, x: int, t1: int, t2: int) -> list[Delta]:
        """Memory changes of moving ``x`` from ``t1`` to the free slot ``t2`` (``can_add(x,
        t2)`` and ``can_remove(x, t1, t2)`` must hold), without changing the state."""
        deltas = self.move_begin(x, t1, t2)
        self.move_abort(x, t2)
        return deltas

    def move_begin(self, x: int, t1: int, t2: int) -> list[Delta]:
        """Like :meth:`move_deltas`, but leaves the lists with ``x`` at both slots; end with
        :meth:`move_abort` or :meth:`commit_move` (saves a list round trip per move)."""
        first = self.add_deltas(x, t2)
        self._lists_add(x, t2)
        return compact(first + self.remove_deltas(x, t1))

    def move_abort(self, x: int, t2: int) -> None:
        self._lists_remove(x, t2)

    # -- the peak after a mutation ---------------------------------------------------------
    def peak_bound(self, deltas: list[Delta]) -> int:
        """A lower bound of the peak after ``deltas``: the new memory at the current peak slot.

        Exact at that slot, so the new peak is at least this; a few Python operations.
        """
        at = self.peak_at
        m = self.peak
        for lo, hi, s in deltas:
            if lo <= at < hi:
                m += s
        return m

    def peak_bounds(self, deltas: list[Delta], disjoint: bool = False) -> tuple[int, int]:
        """``(lower, upper)`` bounds of the peak after ``deltas``: the new memory at the current
        peak slot, and the current peak plus every positive change (plus only the largest one
        when the ranges are ``disjoint``, as :func:`compact` leaves them)."""
        at = self.peak_at
        lower = self.peak
        rise = 0
        for lo, hi, s in deltas:
            if lo <= at < hi:
                lower += s
            if s > 0:
                if disjoint:
                    if s > rise:
                        rise = s
                else:
                    rise += s
        return lower, self.peak + rise

    def peak_with(self, deltas: list[Delta]) -> int:
        """The exact peak after ``deltas``, without applying them; a slot where it is reached
        is left in ``self.new_at`` (so that committing them needs no scan of the profile)."""
        if not deltas:
            self.new_at = self.peak_at
            return self.peak
        mem = self.mem
        if len(deltas) == 1:
            lo, hi, s = deltas[0]
            window = mem[lo:hi]
            i = int(window.argmax())
            local = int(window[i]) + s
        else:
            lo, hi = self.T, 0
            for a, b, _ in deltas:
                if a < lo:
                    lo = a
                if b > hi:
                    hi = b
            window = mem[lo:hi].copy()
            for a, b, s in deltas:
                window[a - lo:b - lo] += s
            i = int(window.argmax())
            local = int(window[i])
        peak = self.peak
        if local >= peak:
            self.new_at = lo + i
            return local
        if not lo <= self.peak_at < hi:
            self.new_at = self.peak_at
            return peak
        # the old peak slot is in the window and went down: the rest of the profile decides
        at = lo + i
        if lo:
            j = int(mem[:lo].argmax())
            v = int(mem[j])
            if v > local:
                local, at = v, j
        if hi < self.T:
            j = hi + int(mem[hi:].argmax())
            v = int(mem[j])
            if v > local:
                local, at = v, j
        self.new_at = at
        return local

    # -- mutations (exact inverses of each other) --------------------------------------------
    def _apply(self, deltas: list[Delta], refresh: bool) -> None:
        """Add ``deltas`` to the profile; without ``refresh`` the caller sets ``peak`` and
        ``peak_at`` (e.g. from :meth:`peak_with`)."""
        mem = self.mem
        for lo, hi, s in deltas:
            mem[lo:hi] += s
        if refresh:
            self.refresh_peak()

    def refresh_peak(self) -> None:
        """Recompute the cached peak and its slot from the profile."""
        at = int(self.mem.argmax())
        self.peak_at = at
        self.peak = int(self.mem[at])

    def _lists_add(self, x: int, t: int) -> None:
        uses_of, prods_of = self.uses, self.prods
        for d in self.table.ins[x]:
            insort(uses_of[d], t)
        for d in self.table.outs[x]:
            insort(prods_of[d], t)

    def _lists_remove(self, x: int, t: int) -> None:
        uses_of, prods_of = self.uses, self.prods
        for d in self.table.outs[x]:
            prods = prods_of[d]
            del prods[bisect_left(prods, t)]
        for d in self.table.ins[x]:
            uses = uses_of[d]
            del uses[bisect_left(uses, t)]

    def commit_add(self, x: int, t: int, deltas: list[Delta], refresh: bool = True) -> None:
        """Place ``x`` at ``t``; ``deltas`` must be ``add_deltas(x, t)`` of the current state."""
        self.seq[t] = x
        self._lists_add(x, t)
        self.cost += self.table.cost[x]
        self._forget_first(x)
        self._apply(deltas, refresh)

    def commit_remove(self, x: int, t: int, deltas: list[Delta], refresh: bool = True) -> None:
        """Remove ``x`` from ``t``; ``deltas`` must be ``remove_deltas(x, t)``."""
        self.seq[t] = NOP
        self._lists_remove(x, t)
        self.cost -= self.table.cost[x]
        self._forget_first(x)
        self._apply(deltas, refresh)

    def commit_move(self, x: int, t1: int, t2: int, deltas: list[Delta],
                    refresh: bool = True, begun: bool = False) -> None:
        """Move ``x`` from ``t1`` to ``t2``; ``deltas`` must be ``move_deltas(x, t1, t2)``
        (``begun``: they came from :meth:`move_begin`, whose list edit is kept)."""
        self.seq[t2] = x
        self.seq[t1] = NOP
        if not begun:
            self._lists_add(x, t2)
        self._lists_remove(x, t1)
        self._forget_first(x)
        self._apply(deltas, refresh)

    def add(self, x: int, t: int, refresh: bool = True) -> None:
        self.commit_add(x, t, self.add_deltas(x, t), refresh)

    def remove(self, x: int, t: int, refresh: bool = True) -> None:
        self.commit_remove(x, t, self.remove_deltas(x, t), refresh)

    # -- views -------------------------------------------------------------------------------
    def order(self) -> list[int]:
        """Placed node indices, in slot order."""
        return [x for x in self.seq if x != NOP]


def needed_nodes(table: NodeTable) -> list[bool]:
    """Nodes that some fixed node depends on (through its inputs, transitively).

    A fixed node (loss, backward, output producer) stays placed exactly once, so every node it
    reads from keeps at least one copy before it, and so on up: the only copy of such a node is
    never removable. Table indices follow a topological order (readers after producers).
    """
    producer = {d: x for x in range(len(table)) for d in table.outs[x]}
    needed = [False] * len(table)
    for y in range(len(table) - 1, -1, -1):
        if table.movable_only[y] or needed[y]:
            for d in table.ins[y]:
                x = producer.get(d)
                if x is not None:
                    needed[x] = True
    return needed


def proposal_sets(state: SlotState) -> tuple[list[int], list[bool], dict[int, list[int]],
                                              list[int], list[int]]:
    """What the annealer draws from: ``(pool, needed, slots_of, removable, placed)``.

    ``pool``: nodes that may be added. Removal candidates: slots of pool nodes that have
    another copy, or whose outputs nothing placed for good depends on. The only copy of a node
    that a fixed node needs (through its readers) can never be removed, so leaving it out keeps
    the removals drawn uniform among the valid ones and saves the draws that would fail.
    ``placed``: every occupied slot but the loss's (move candidates). Pinned first copies
    (:meth:`SlotState.pin_first_copies`) are neither removed nor moved.
    """
    table, seq, T = state.table, state.seq, state.T
    fixed = table.movable_only
    pool = [x for x in range(len(table)) if not fixed[x]]
    needed = needed_nodes(table)
    slots_of: dict[int, list[int]] = {}
    for t in range(T):
        if seq[t] != NOP:
            slots_of.setdefault(seq[t], []).append(t)
    pin = state.pin
    removable = [t for t in range(T) if seq[t] != NOP and not fixed[seq[t]] and t != pin[seq[t]]
                 and (len(slots_of[seq[t]]) > 1 or not needed[seq[t]])]
    placed = [t for t in range(T) if seq[t] != NOP and t != state.loss_slot and t != pin[seq[t]]]
    return pool, needed, slots_of, removable, placed
