"""The ``hiremate`` command line: ``demo``, ``inspect``, ``sweep``, ``solve`` and ``plot``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

from hiremate.errors import HiremateError
from hiremate.units import fmt_bytes


def _build(name: str, layers: int | None, width: int | None, batch: int | None,
           cost_model: str):
    from hiremate import build_graph, zoo

    model, sample = zoo.get(name, layers=layers, width=width, batch=batch)
    start = time.perf_counter()
    graph = build_graph(model, sample, cost_model=cost_model)
    return model, sample, graph, time.perf_counter() - start


def graph_summary(graph) -> dict:
    """The figures ``inspect`` and ``demo`` print (HiRemate Table 3(a) columns)."""
    from hiremate import autodiff_schedule, simulate

    sim = simulate(graph, autodiff_schedule(graph))
    return {
        "forward ops (captured)": graph.meta.get("fwd_ops_before"),
        "forward ops (after simplification)": len(graph.fwd_nodes),
        "compute nodes": len(graph.nodes),
        "data nodes": len(graph.data),
        "capture path": graph.meta.get("capture_path"),
        "autodiff peak (simulated)": fmt_bytes(sim.peak),
        "iteration time (sum of nodes)": f"{sim.time * 1e3:.2f} ms",
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    _, _, graph, seconds = _build(args.name, args.layers, args.width, args.batch, args.cost_model)
    print(f"{args.name}: graph built in {seconds:.2f} s")
    for key, value in graph_summary(graph).items():
        print(f"  {key:38s} {value}")
    if args.partition:
        from hiremate.partition import draw_hierarchy
        from hiremate.registry import make_partitioner

        hierarchy = make_partitioner(args.partitioner).partition(graph)
        print(f"hierarchy ({args.partitioner}):")
        for key, value in hierarchy.summary().items():
            print(f"  {key:38s} {value}")
        if args.draw:
            draw_hierarchy(hierarchy, args.draw)
            print(f"  picture written to {args.draw}")
    if args.save:
        graph.save(args.save)
        print(f"graph written to {args.save}")
    return 0


#: the demo's model sizes: a step of a few milliseconds, so that the measured time is the
#: schedule's recomputation and not the executor's fixed cost per step (its Python; docs/
#: benchmarks.md, "Executor overhead"), which dominates a step at the zoo's default sizes
DEMO_SIZES = {"mlp": {"width": 512, "batch": 128}}
#: rounds that time eager and the wrapper in turn; each side's fastest round is printed (one
#: round of each, one after the other, is as noisy as a shared CPU's load)
DEMO_ROUNDS = 5


def _paired(measure, model, remat, call_args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """Eager's and the wrapper's measurements, timed in alternation: each side's peak is its
    largest and its time its fastest round's (the median of three steps)."""
    rounds: list[tuple[Any, Any]] = []
    for _ in range(DEMO_ROUNDS):
        rounds.append((measure(model, *call_args, **kwargs), measure(remat, *call_args, **kwargs)))
    return tuple(replace(min((r[i] for r in rounds), key=lambda m: m.time),
                         peak=max(r[i].peak for r in rounds)) for i in (0, 1))


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole pipeline on a zoo model at half its autodiff peak: capture, solve (default
    preset), run, and the measured figures next to eager PyTorch's."""
    from hiremate import measure
    from hiremate.api import HRockmate

    budget = getattr(args, "budget", 0.5)
    sizes = DEMO_SIZES.get(args.model, {})
    model, sample, graph, seconds = _build(args.model, sizes.get("layers"), sizes.get("width"),
                                           sizes.get("batch"), "auto")
    shown = "".join(f", {k} {v}" for k, v in sizes.items())
    print(f"hiremate demo on the zoo's {args.model!r}{shown} ({graph!r}), built in "
          f"{seconds:.2f} s")
    for key, value in graph_summary(graph).items():
        print(f"  {key:38s} {value}")
    call_args, kwargs = (((), sample) if isinstance(sample, dict)
                         else ((sample if isinstance(sample, tuple) else (sample,)), {}))
    remat = HRockmate.from_graph(model, graph, budget, "hiremate", sample=sample,
                                 progress=False)
    rep = remat.report()
    print(f"solved at {budget:g} x the autodiff peak = {fmt_bytes(rep['budget'])} "
          f"in {rep['solve_time']:.2f} s (winner: {rep['solver']}; "
          f"{'flat' if rep['flat_path'] else 'hierarchical'} path)")
    print(f"  {'predicted peak / autodiff':38s} {fmt_bytes(rep['predicted_peak'])} / "
          f"{fmt_bytes(rep['autodiff_peak'])} ({rep['relative_peak']:.2f})")
    print(f"  {'predicted time / autodiff':38s} {rep['predicted_time'] * 1e3:.2f} ms / "
          f"{rep['autodiff_time'] * 1e3:.2f} ms ({rep['relative_time']:.2f})")
    if rep.get("relative_time_bound"):
        print(f"  {'lower bound (in-order schedules)':38s} {rep['time_bound'] * 1e3:.2f} ms "
              f"({rep['relative_time_bound']:.2f})")
    eager, mine = _paired(measure, model, remat, call_args, kwargs)
    print(f"  {'':38s} {'eager':>12s} {'hiremate':>12s} {'ratio':>7s}")
    print(f"  {'peak activation memory (measured)':38s} {fmt_bytes(eager.peak):>12s} "
          f"{fmt_bytes(mine.peak):>12s} {mine.peak / max(eager.peak, 1):7.2f}")
    print(f"  {'iteration time (measured)':38s} {eager.time * 1e3:9.2f} ms "
          f"{mine.time * 1e3:9.2f} ms {mine.time / max(eager.time, 1e-12):7.2f}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hiremate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the pipeline on a built-in model")
    demo.add_argument("--model", default="mlp",
                      help="zoo model (default: mlp, built in: no optional extra needed)")
    demo.set_defaults(func=cmd_demo)

    inspect = sub.add_parser("inspect", help="build a zoo model's graph and print its sizes")
    inspect.add_argument("name", help="zoo model name (see hiremate.zoo.names())")
    inspect.add_argument("--layers", type=int)
    inspect.add_argument("--width", type=int)
    inspect.add_argument("--batch", type=int)
    inspect.add_argument("--cost-model", default="flops",
                         choices=("auto", "measured", "flops", "roofline"),
                         help="node times (default flops: the same on every machine)")
    inspect.add_argument("--partition", action="store_true", help="also print the hierarchy")
    inspect.add_argument("--partitioner", default="hpartition")
    inspect.add_argument("--draw", metavar="PNG", help="with --partition: write a picture")
    inspect.add_argument("--save", metavar="JSON", help="write the graph to this file")
    inspect.set_defaults(func=cmd_inspect)

    from hiremate.sweep.cli import add_commands  # sweep, solve, plot

    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except HiremateError as exc:
        print(f"hiremate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
