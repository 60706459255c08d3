"""Helpers shared by the paper benchmarks (``bench/paper_table.py``, ``bench/table2.py``).

The paper's figures these scripts print beside ours, the configuration built from a preset and
``--set key=value`` overrides, graphs built once and cached, the lower bound of a budget (the
moment bound, and the LP relaxation of the flat H-ILP when the graph is small enough) and the
end-to-end check of a schedule (measured peak, gradients against eager PyTorch).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch.utils import _pytree as pytree

import hiremate
from hiremate import zoo
from hiremate.config import Config, load_config, merge_mappings
from hiremate.ir.graph import Graph

log = logging.getLogger("bench.paper")

#: The paper's Table 3(c), per model: total solving time (minutes), budget (GB), observed
#: relative peak memory, predicted relative average time, observed relative average time
#: (None where the paper has no figure).
PAPER_TABLE3C: dict[str, tuple[float, float, float, float, float | None]] = {
    "gpt-24": (7.9, 1.7, 0.366, 1.223, 1.203),
    "gpt-96": (15, 4.5, 0.472, 1.196, 1.260),
    "unet": (9, 5, 0.513, 1.135, 1.133),
    "mlpmixer": (1.5, 4.5, 0.533, 1.073, 1.090),
    "regnet32": (5, 3.5, 0.411, 1.070, 1.058),
    "resnet101": (5.5, 4.5, 0.426, 1.153, 1.153),
    "transformer-6-6": (20, 3.5, 0.469, 1.176, 1.148),
    "transformer-36-36": (147, 4.9, 0.446, 1.184, None),
    "fno1d": (2.5, 5, 0.531, 1.147, 1.110),
    "fno3d": (5.3, 4, 0.472, 1.174, 1.041),
}


# -- configuration --------------------------------------------------------------------------------
def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``["a=1", "solver_params.hilp.time_limit=5"]`` as a nested dict; values are YAML
    (``true``, ``[hilp]``, ``{max_top: 8}``), so a typo in a key fails in :class:`Config`."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes key=value, got {item!r}")
        value = yaml.safe_load(text) if text.strip() else None
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {p!r} was given a value before")
        node[parts[-1]] = value
    return out


def make_config(config: str = "hiremate", sets: list[str] | None = None,
                **defaults: Any) -> Config:
    """The preset (or YAML file) ``config`` with the benchmark's ``defaults`` (cache off, no
    calibration...) and then the user's ``--set`` overrides merged over it."""
    data = load_config(config).to_dict()
    data = merge_mappings(merge_mappings(data, defaults), parse_sets(sets))
    return Config.from_dict(data)


def add_common_arguments(parser: Any, set_help: str) -> None:
    """The options both paper scripts take: cost model, workers, graph cache, LP bound,
    preset and overrides, JSON output."""
    parser.add_argument("--cost", choices=("flops", "measure", "measured", "roofline", "auto"),
                        default="flops")
    parser.add_argument("--n-jobs", type=int, default=2, help="menu workers (default 2)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder of built graphs (flops graphs only)")
    parser.add_argument("--lp-max-nodes", type=int, default=300,
                        help="LP bound on graphs of at most this many compute nodes")
    parser.add_argument("--lp-time", type=float, default=600.0, help="LP time limit (s)")
    parser.add_argument("--config", default="hiremate", help="preset name or YAML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=set_help)
    parser.add_argument("--json", action="store_true")


#: The packages whose versions decide a solve's result (the MILP solvers, FastSA's compiler
#: and the numerics under them): a figure reproduces to the digit only with the same ones.
RESULT_PACKAGES = ("torch", "numpy", "scipy", "numba", "highspy", "ortools", "networkx")


def installed_versions() -> dict[str, str]:
    """The installed versions of :data:`RESULT_PACKAGES` ("-" for one that is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in RESULT_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    return out


# -- graphs ---------------------------------------------------------------------------------------
def moved(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) on ``device``."""
    return pytree.tree_map(
        lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def graph_of(key: str, make: Callable[[], tuple[torch.nn.Module, Any]], cost: str,
             cache: Path | None = None) -> tuple[Graph, float]:
    """The graph of ``make()``'s model and sample with cost model ``cost`` and the seconds its
    build took (0 when read from ``cache``; only ``flops`` graphs are cached: measured costs
    belong to one machine and one moment)."""
    path = cache / f"{key}-{cost}.graph" if cache is not None and cost == "flops" else None
    if path is not None and path.exists():
        return Graph.load(path), 0.0
    model, sample = make()
    start = time.perf_counter()
    graph = hiremate.build_graph(model, sample, cost_model=cost)
    took = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save(path)
    return graph, took


def solve_own_problem(graph: Graph, budget: int, cfg: Any):
    """The graph's own problem, the paper's: its peak within ``budget``, with none of what
    :func:`hiremate.solve_graph` reserves for the whole step (the loss, the output gradients,
    the generator states of rerun random ops); menus shared within this one solve."""
    from hiremate.composer.menu_cache import CallCache
    from hiremate.composer.solve import solve

    return solve(graph, budget, cfg, CallCache())


# -- bounds ---------------------------------------------------------------------------------------
def lower_bound(graph: Graph, budget: int, max_nodes: int, time_limit: float
                ) -> tuple[float, str, float]:
    """A time no schedule within ``budget`` beats (of those that first run the nodes in the
    graph's order, as H-ILP's do), what it is, and the seconds it took: the larger of the
    moment bound (``"moment"``: :func:`hiremate.solvers.hilp.moment_bound.moment_time_bound`,
    any graph size, seconds) and the LP relaxation of the flat H-ILP (``"LP"``) on graphs
    of at most ``max_nodes`` compute nodes (``"moment (LP stopped)"`` when the LP stopped
    before its optimum). ``inf`` with ``"LP infeasible"`` or ``"memory floor"``: nothing fits."""
    from hiremate.solvers.hilp.flat import lower_bound as lp_bound
    from hiremate.solvers.hilp.moment_bound import moment_time_bound

    start = time.perf_counter()
    moment = moment_time_bound(graph, budget)  # never below autodiff's time
    if math.isinf(moment):
        return moment, "memory floor", time.perf_counter() - start
    if len(graph.nodes) > max_nodes:
        return moment, "moment", time.perf_counter() - start
    value = lp_bound(graph, budget, time_limit=time_limit)
    took = time.perf_counter() - start
    if value is None:
        return moment, "moment (LP stopped)", took
    if math.isinf(value):
        return value, "LP infeasible", took
    return (value, "LP", took) if value > moment else (moment, "moment", took)


def gap(time: float, bound: float) -> float:
    """How much slower than the bound ``time`` is (0.05: 5%); nan without a finite bound."""
    return time / bound - 1 if bound and math.isfinite(bound) else float("nan")


# -- end to end -----------------------------------------------------------------------------------
def _grads(fn: Callable, model: torch.nn.Module, sample: Any) -> dict[str, torch.Tensor]:
    args, kwargs = zoo.split_sample(sample)
    for p in model.parameters():
        p.grad = None
    zoo.output_loss(fn(*args, **kwargs)).backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters()
           if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return out


def execute(model: torch.nn.Module, sample: Any, graph: Graph, budget: int, cfg: Config
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wrap ``model`` with the schedule solved for ``graph`` (one solve) and run it: the
    wrapper's report, and the measured peak over the budget, the measured peak over eager
    PyTorch's, and the largest gradient difference from eager (run the model in float64 for a
    difference that means something)."""
    from hiremate.api import HRockmate

    start = time.perf_counter()
    remat = HRockmate.from_graph(model, graph, budget, config=cfg, sample=sample)
    wrap_s = time.perf_counter() - start
    log.info("wrapped (solve and code generation) in %.1f s", wrap_s)
    args, kwargs = zoo.split_sample(sample)
    peak = hiremate.measure(remat, *args, **kwargs).peak
    eager_peak = hiremate.measure(model, *args, **kwargs).peak
    log.info("peaks measured at %.1f s", time.perf_counter() - start)
    eager, mine = _grads(model, model, sample), _grads(remat, model, sample)
    run_s = time.perf_counter() - start - wrap_s
    log.info("gradients compared; runs took %.1f s", run_s)
    if eager.keys() != mine.keys():
        diff = float("inf")
    else:
        diff = max((float((mine[k] - eager[k]).abs().max()) for k in eager), default=0.0)
    facts = {"measured_peak_over_budget": peak / budget,
             "measured_relative_peak": peak / eager_peak if eager_peak else float("nan"),
             "max_grad_diff": diff, "wrap_s": round(wrap_s, 1), "run_s": round(run_s, 1)}
    return remat.report(), facts


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats rounded, None and nan as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value else f"{value:.{digits}f}"
    if isinstance(value, (list, tuple)):
        return "/".join(map(str, value))
    return str(value)
