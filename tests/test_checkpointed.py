"""An option behind a checkpoint (``solvers.menu.checkpointed``), and ``hilp-top``'s menus that
use it for a save bound of the outputs alone instead of that budget's MILP.

Truths used: the simulator (``option_from_schedule`` raises on an invalid schedule and measures
every figure) and the definition: the forward part runs every forward node once and keeps only
the outputs, the backward part runs no more steps than the option it wraps.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiremate.errors import HiremateError
from hiremate.ir.schedule import Compute
from hiremate.ir.simulator import autodiff_schedule, trace
from hiremate.partition import SequencePartition
from hiremate.solvers.hilp.flat import HilpSolver
from hiremate.solvers.hilp.top import HilpTop
from hiremate.solvers.menu import (budget_grid, checkpointed, option_from_schedule,
                                   option_steps, output_bytes)
from hiremate.testing.synthetic import random_graph
from test_hilp_hier import problem_of
from test_registry import residual_chain


def _options(graph):
    """The store-all option and H-ILP's options at a small grid: what a menu holds."""
    out = [option_from_schedule(graph, autodiff_schedule(graph), "autodiff")]
    solver = HilpSolver(time_limit=5.0, work_limit=20)
    for peak, save in budget_grid(graph, 2, 2):
        try:
            out.append(option_from_schedule(graph, solver.solve(graph, peak, save).schedule))
        except HiremateError:
            pass
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), n=st.integers(5, 9))
def test_an_option_behind_a_checkpoint_is_valid_phantom_free_and_no_slower(seed, n):
    graph = random_graph(seed, n)
    plain = sum(node.time for node in graph.fwd_nodes)
    fwd_ids = [node.id for node in graph.fwd_nodes]
    for option in _options(graph):
        behind = checkpointed(graph, option_steps(option))  # simulated: raises if invalid
        assert behind.phantom == 0
        assert [s.node for s in behind.fwd if isinstance(s, Compute)] == fwd_ids
        assert behind.fwd_time == pytest.approx(plain)
        # the backward part runs the wrapped option's steps, less the recomputations that
        # nothing reads: at most one plain forward more than the option
        assert behind.bwd_time <= option.time + 1e-12
        assert behind.time <= plain + option.time + 1e-12
        bwd_steps = [s.node for s in behind.bwd if isinstance(s, Compute)]
        assert set(bwd_steps) >= {node.id for node in graph.bwd_nodes}


def test_a_forward_nothing_reads_again_is_not_rerun():
    graph = residual_chain(4)
    store_all = option_from_schedule(graph, autodiff_schedule(graph))
    behind = checkpointed(graph, option_steps(store_all))
    outputs = set(graph.outputs)
    makers_of_outputs_only = {node.id for node in graph.fwd_nodes
                              if node.outputs and set(node.outputs) <= outputs}
    assert makers_of_outputs_only
    rerun = {s.node for s in behind.bwd if isinstance(s, Compute)}
    assert not rerun & makers_of_outputs_only  # their outputs are kept from the forward


def _count_solves(monkeypatch) -> list[tuple]:
    """``hilp-top``'s MILPs from here on, as (peak, save) pairs."""
    calls: list[tuple] = []
    real = HilpTop.solve_at

    def counting(self, problem, top, abstract, *args, **kw):
        calls.append((abstract, kw.get("save_budget")))
        return real(self, problem, top, abstract, *args, **kw)

    monkeypatch.setattr(HilpTop, "solve_at", counting)
    return calls


def test_a_menu_meets_a_save_of_the_outputs_alone_without_its_milp(monkeypatch):
    problem = problem_of(residual_chain(3), SequencePartition())
    graph = problem.graph
    tr = trace(graph, autodiff_schedule(graph))
    peak, outputs = tr.peak, output_bytes(graph)
    calls = _count_solves(monkeypatch)
    solver = HilpTop(work_limit=50, time_limit=60.0, refine_rounds=0)
    options = solver.compose_menu(problem, [(peak, None), (peak, outputs)])
    assert calls == [(peak, None)]  # the outputs-only save ran no MILP
    assert any(o.phantom == 0 for o in options)
    for o in options:  # every option is a valid schedule of the subgraph (simulated again)
        again = option_from_schedule(graph, (*o.fwd, Compute(graph.loss), *o.bwd))
        assert again.time == pytest.approx(o.time)


def test_a_peak_whose_only_budget_is_the_outputs_only_save_is_solved_by_its_milp(
        monkeypatch):
    problem = problem_of(residual_chain(3), SequencePartition())
    graph = problem.graph
    peak = trace(graph, autodiff_schedule(graph)).peak
    outputs = output_bytes(graph)
    calls = _count_solves(monkeypatch)
    solver = HilpTop(work_limit=50, time_limit=60.0, refine_rounds=0)
    options = solver.compose_menu(problem, [(peak, outputs)])
    assert calls[0] == (peak, outputs)
    assert options and all(o.phantom == 0 for o in options)
