"""Context-aware menu refinement for the hierarchical H-ILP (``hilp-top``).

Why: a block's menu is solved before the level above is known, over a fixed grid of
``(M_peak, M_save)`` budgets, so the option that would fit the memory the rest of the model
leaves to the block is often missing; the top level then takes the next smaller option and
recomputes more than it needs (on the zoo's U-Net the menu's phantoms jump past what the flat
H-ILP keeps for the same block; docs/benchmarks.md has the figures).

What: after a top-level solve, the chosen schedule of the full graph (simulated) says how much
memory each large block had to spare: below the budget during the runs of its forward part
with the option it used, during its backward part, and at every top-level step while its
phantom was kept (from the forward run that made it to its backward). Each of those slacks is
what the block's own memory can grow by there while the rest of the schedule stays as it is,
so the block's H-ILP is solved again with

- peak budget ``min(fwd_peak + slack_fwd, bwd_peak + slack_bwd)`` (both figures of the used
  option on the block's own graph: its forward and backward memory, the phantom included);
- save budget (memory kept before the block's loss) ``held + slack_phantom``, and also
  ``held + slack_phantom / 2`` and halfway to the next larger and the next smaller save of the
  menu, so that the level above has neighbours to trade with;

and the options that enter the block's Pareto front are added to its menu. Only blocks whose
menu holds H-ILP options are refined (the configuration chose H-ILP for them). Identical blocks
share a menu, refined once for the tightest of their contexts; the largest blocks go first,
and no more than ``max_solves`` block H-ILPs are run (a count, not a clock: the refinement
gives the same menus at any machine load). The top level is
then solved again with the larger menus (:class:`hiremate.solvers.hilp.top.HilpTop`,
``refine_rounds``); its earlier candidates are kept, so a round never makes the result worse.
The slacks come from the simulator, the truth, which the top-level model bounds from above; a
new option that does not fit the top-level model's accounting is simply not chosen.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from hiremate.errors import InfeasibleBudgetError, SolverError
from hiremate.ir.option import Option, pareto_front
from hiremate.ir.schedule import Compute, Schedule
from hiremate.ir.simulator import trace

if TYPE_CHECKING:
    from hiremate.ir.blocks import Block, TopProblem
    from hiremate.solvers.hilp.hier import TopGraph

log = logging.getLogger(__name__)

#: solver name of the options this module adds (reported per block by ``block_solvers``)
SOLVER_NAME = "hilp-context"
#: a block is refined only when its menu already holds options of these solvers: the
#: configuration chose H-ILP for it, so solving it with H-ILP again is within that choice
#: (a configuration with TW-Remat menus only gets no block H-ILP from the top level)
HILP_NAMES = frozenset({"hilp", "checkmate", SOLVER_NAME})


@dataclass(frozen=True)
class BlockContext:
    """What the top-level schedule left to one block (bytes; see the module docstring)."""

    block: int
    option: int
    fwd_peak: int     # the used option's forward memory on the block's graph
    held: int         # ... memory kept before the block's loss (outputs and phantom)
    bwd_peak: int     # ... backward memory
    slack_fwd: int
    slack_phantom: int
    slack_bwd: int

    def budgets(self, menu_saves: Sequence[int]) -> list[tuple[int, int]]:
        """``(peak, save)`` pairs to solve the block at (module docstring)."""
        peak = min(self.fwd_peak + self.slack_fwd, self.bwd_peak + self.slack_bwd)
        top = self.held + self.slack_phantom
        saves = {top, self.held + self.slack_phantom // 2}
        above = [s for s in menu_saves if s > top]
        below = [s for s in menu_saves if s < self.held]
        if above:
            saves.add((top + min(above)) // 2)
        if below:
            saves.add((self.held + max(below)) // 2)
        return [(int(peak), int(s)) for s in sorted(saves)]


def local_figures(block: "Block", option: Option) -> tuple[int, int, int]:
    """Forward peak, memory held before the loss, backward peak of ``option`` on the block's
    graph (the simulator's accounting, as the block's H-ILP budgets count)."""
    sub = block.graph
    sched = tuple(option.fwd) + (Compute(sub.loss),) + tuple(option.bwd)
    tr = trace(sub, sched)
    cut = len(option.fwd)
    fwd = max(tr.during[:cut], default=0)
    held = tr.after[cut - 1] if cut else 0
    bwd = max(tr.during[cut:], default=0)
    return fwd, held, bwd


def step_slacks(problem: "TopProblem", top: "TopGraph", steps, schedule: Schedule,
                budget: int) -> list[int | None]:
    """Per top-level step (phase, node, option) of a solution: ``budget`` minus the highest
    simulated memory while its full-graph steps run (None for a step with no compute, e.g. the
    backward of a block that has no backward node)."""
    during = trace(problem.graph, schedule).during
    comp = [i for i, s in enumerate(schedule) if isinstance(s, Compute)]
    out: list[int | None] = []
    ci = 0
    for _, k, o in steps:
        n = len(top.sequence(k, o))
        if n == 0:
            out.append(None)
            continue
        a = comp[ci]
        b = comp[ci + n] if ci + n < len(comp) else len(schedule)
        out.append(budget - max(during[a:b]))
        ci += n
    if ci != len(comp):
        raise SolverError("hilp-top refinement: the top-level steps do not cover the schedule "
                          "(a bug)")
    return out


def block_contexts(problem: "TopProblem", top: "TopGraph", steps, schedule: Schedule,
                   budget: int, min_nodes: int) -> list[BlockContext]:
    """The context in one solution of every block of at least ``min_nodes`` forward nodes whose
    menu holds H-ILP options (:data:`HILP_NAMES`)."""
    from hiremate.solvers.hilp.hier import checkpoint_options

    slack = step_slacks(problem, top, steps, schedule, budget)
    out: list[BlockContext] = []
    for j, blk in enumerate(problem.blocks):
        if len(blk.fwd) < min_nodes or not any(o.solver in HILP_NAMES for o in blk.options):
            continue
        b_steps = [i for i, (_, k, _) in enumerate(steps)
                   if top.kind[k] == "B" and top.block[k] == j]
        if not b_steps or slack[b_steps[-1]] is None:
            continue
        bi = b_steps[-1]
        o = steps[bi][2]
        f_steps = [i for i, (_, k, oo) in enumerate(steps)
                   if top.kind[k] == "F" and top.block[k] == j and oo == o]
        made = [i for i in f_steps if i < bi]
        if not made:
            continue
        fi = made[-1]
        kept = [s for s in slack[fi + 1:bi + 1] if s is not None]
        options = blk.options + checkpoint_options(blk)
        fwd, held, bwd = local_figures(blk, options[o])
        out.append(BlockContext(
            j, o, fwd, held, bwd, slack_fwd=min(slack[i] for i in f_steps),
            slack_phantom=min(kept) if kept else 0, slack_bwd=slack[bi]))
    return out


def refine(problem: "TopProblem", top: "TopGraph", steps, schedule: Schedule, budget: int,
           min_nodes: int = 8, time_limit: float | None = None, max_solves: int = 16,
           work_limit: float | None = None) -> tuple["TopProblem | None", dict]:
    """Blocks with options solved for the context of ``schedule`` (module docstring): a new
    problem whose blocks' menus gained Pareto options, or None when none did; and facts.
    Each block H-ILP stops at ``work_limit`` (None: the backend's default), with
    ``time_limit`` seconds as a safety cap (None: the default cap); at most ``max_solves``
    are run."""
    from hiremate.ir.blocks import TopProblem
    from hiremate.solvers.hilp.flat import HilpSolver
    from hiremate.solvers.menu import option_from_schedule

    start = time.perf_counter()
    caps = {} if time_limit is None else {"time_limit": float(time_limit)}
    contexts = block_contexts(problem, top, steps, schedule, budget, min_nodes)
    # identical blocks share one menu: refine it once, for the tightest of their contexts
    # (the least memory to keep, then the lowest peak), which fits the others' as well when
    # they used the same option
    tightest: dict[str, BlockContext] = {}
    for ctx in contexts:
        key = problem.blocks[ctx.block].key
        room = (ctx.held + ctx.slack_phantom,
                min(ctx.fwd_peak + ctx.slack_fwd, ctx.bwd_peak + ctx.slack_bwd))
        old = tightest.get(key)
        if old is None or room < (old.held + old.slack_phantom,
                                  min(old.fwd_peak + old.slack_fwd, old.bwd_peak + old.slack_bwd)):
            tightest[key] = ctx
    added: dict[str, list[Option]] = {}
    facts = {"contexts": len(contexts), "refined": 0, "solves": 0, "added": 0}
    # the largest blocks first: where the menu's coarseness costs most
    for ctx in sorted(tightest.values(), key=lambda c: -len(problem.blocks[c.block].fwd)):
        if facts["solves"] >= max_solves:
            facts["stopped"] = "solves"
            break
        facts["refined"] += 1
        blk = problem.blocks[ctx.block]
        menu = blk.options + added.get(blk.key, [])
        saves = sorted({local_figures(blk, o)[1] for o in menu})
        solver = HilpSolver(work_limit=work_limit, max_nodes=max(400, len(blk.graph.nodes)),
                            **caps)
        new: list[Option] = []
        for peak, save in ctx.budgets(saves):
            if facts["solves"] >= max_solves:
                facts["stopped"] = "solves"
                break
            facts["solves"] += 1
            try:
                res = solver.solve(blk.graph, peak, save)
            except InfeasibleBudgetError:
                continue
            except SolverError as exc:
                if not getattr(exc, "timed_out", False):
                    raise
                continue
            new.append(option_from_schedule(blk.graph, res.schedule, SOLVER_NAME))
        front = pareto_front(menu + new)
        gained = [o for o in front if any(o is n for n in new)]
        log.info("hilp-top refinement of block %d (option %d; slack fwd %d, phantom %d, bwd "
                 "%d): %d of %d new options on the Pareto front", ctx.block, ctx.option,
                 ctx.slack_fwd, ctx.slack_phantom, ctx.slack_bwd, len(gained), len(new))
        if gained:
            added.setdefault(blk.key, []).extend(gained)
            facts["added"] += len(gained)
    facts["seconds"] = round(time.perf_counter() - start, 3)
    if not added:
        return None, facts
    blocks = [replace(b, options=list(b.options) + added.get(b.key, []))
              for b in problem.blocks]
    return TopProblem(problem.graph, blocks, problem.tail), facts


__all__ = ["BlockContext", "SOLVER_NAME", "block_contexts", "local_figures", "refine",
           "step_slacks"]
