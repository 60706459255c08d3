"""Range-add / global-max segment tree over time slots.

The add-max segment tree of "A fast heuristic to optimize time-space tradeoff for large
models" (FastSA), section 2.1.1.

FastSA keeps the memory held at every time slot of its sequence. A mutation moves the ends of a
few lifetime intervals, i.e. adds a value size to a few slot ranges; the objective needs the
highest slot afterwards. This tree does each range add in ``O(log T)`` and reads the maximum
at the root in ``O(1)``.

The annealer keeps the profile in a NumPy array instead
(:mod:`hiremate.solvers.fastsa.state`: in pure Python a range add here costs more than a NumPy
slice addition, and most mutations are judged without applying anything; docs/benchmarks.md,
"FastSA evaluation rate"); this tree stays as a tested reference implementation.

Layout (iterative, no recursion, flat Python lists for speed): ``mx[i]`` is the maximum of the
subtree of ``i`` *including* the additions pending at ``i`` (``tag[i]``), so
``mx[i] = max(mx[2i], mx[2i+1]) + tag[i]`` for internal nodes and ``mx[1]`` is the global max.
"""

from __future__ import annotations


_PAD = -(1 << 62)


class AddMaxSegmentTree:
    """Slots ``0 .. size-1``, all starting at 0 (or ``fill``)."""

    __slots__ = ("n", "mx", "tag")

    def __init__(self, size: int, fill: int = 0):
        n = 1
        while n < max(size, 1):
            n *= 2
        self.n = n
        self.mx = [0] * (2 * n)
        self.tag = [0] * n
        # padding slots past ``size`` hold a huge negative value so they never win the max
        self.mx[n:] = [fill] * size + [_PAD] * (n - size)
        for i in range(n - 1, 0, -1):
            self.mx[i] = max(self.mx[2 * i], self.mx[2 * i + 1])

    def add(self, lo: int, hi: int, x: int) -> None:
        """Add ``x`` to every slot in ``[lo, hi)``."""
        if lo >= hi:
            return
        mx = self.mx
        tag = self.tag
        n = self.n
        lo += n
        hi += n
        a = lo >> 1
        b = (hi - 1) >> 1
        while lo < hi:
            if lo & 1:
                mx[lo] += x
                if lo < n:
                    tag[lo] += x
                lo += 1
            if hi & 1:
                hi -= 1
                mx[hi] += x
                if hi < n:
                    tag[hi] += x
            lo >>= 1
            hi >>= 1
        # refresh the ancestors of both ends, level by level, until their paths merge
        while a != b:
            l, r = mx[2 * a], mx[2 * a + 1]
            mx[a] = (l if l > r else r) + tag[a]
            l, r = mx[2 * b], mx[2 * b + 1]
            mx[b] = (l if l > r else r) + tag[b]
            a >>= 1
            b >>= 1
        while a:
            l, r = mx[2 * a], mx[2 * a + 1]
            mx[a] = (l if l > r else r) + tag[a]
            a >>= 1

    def max(self) -> int:
        """Highest slot value."""
        return self.mx[1]

    def value(self, i: int) -> int:
        """Value of slot ``i`` (for tests): the leaf plus the pending additions above it."""
        i += self.n
        total = self.mx[i]
        i >>= 1
        while i:
            total += self.tag[i]
            i >>= 1
        return total

    def range_max(self, lo: int, hi: int) -> int:
        """Highest value in ``[lo, hi)``, slot by slot (for tests and diagnostics only)."""
        best = None
        for i in range(lo, hi):
            v = self.value(i)
            best = v if best is None or v > best else best
        return best if best is not None else 0
