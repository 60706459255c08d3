"""The stages import downward only, and no module imports itself back through others.

Reads every module's source with ``ast`` (every import statement, also those inside functions
and ``TYPE_CHECKING`` blocks: a deferred import is still a dependency) and checks it against the
layer map that docs/layout.md draws. A module may import its own layer and the layers below;
the three stage packages that read the IR (graphbuilder, partition, solvers) do not import each
other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "hiremate.graphbuilder": ROOT / "graphbuilder",
    "hiremate.partition": ROOT / "partition",
    "hiremate.solvers": ROOT / "solvers",
    "hiremate": ROOT / "hiremate",
}

#: lowest first; a module belongs to the longest prefix listed
LAYERS: list[tuple[str, ...]] = [
    ("hiremate.errors", "hiremate.units", "hiremate.quiet", "hiremate.paths",
     "hiremate.cuda_trace"),
    ("hiremate.ir",),
    ("hiremate.graphbuilder", "hiremate.partition", "hiremate.solvers"),
    ("hiremate.testing",),
    ("hiremate.registry", "hiremate.config"),
    ("hiremate.composer",),
    ("hiremate.runtime",),
    ("hiremate.api", "hiremate.cli", "hiremate.sweep", "hiremate.zoo", "hiremate"),
]
#: stage packages of one layer that must not import each other
SIBLINGS = ("hiremate.graphbuilder", "hiremate.partition", "hiremate.solvers")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            # hiremate/ holds no stage packages of its own name, but skip overlaps defensively
            found.setdefault(name, path)
    return found


def _prefix(module: str, prefixes) -> str | None:
    best = None
    for p in prefixes:
        if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def _layer(module: str) -> tuple[int, str]:
    every = [(i, p) for i, group in enumerate(LAYERS) for p in group]
    p = _prefix(module, [p for _, p in every])
    assert p is not None, f"{module} is in no layer: add it to LAYERS and docs/layout.md"
    return next(i for i, q in every if q == p), p


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(module: str, path: Path, known: set[str], runtime_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    skip = _type_only(tree) if runtime_only else set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{a.name}" for a in node.names]
        for n in names:
            # the most specific known module this import names
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != module:
                out.add(n)
    return out


def _graph(runtime_only: bool = False) -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for m, path in mods.items():
        g.add_node(m)
        for dep in _imports(m, path, set(mods), runtime_only):
            g.add_edge(m, dep)
    return g


def _is_parent(pkg: str, module: str) -> bool:
    return module.startswith(pkg + ".")


def test_every_module_has_a_layer():
    for m in _modules():
        _layer(m)


def test_stages_import_downward_only():
    bad = []
    for a, b in _graph().edges:
        if _is_parent(b, a):  # importing one's own package runs its __init__ first anyway
            continue
        (la, pa), (lb, pb) = _layer(a), _layer(b)
        if lb > la:
            bad.append(f"{a} (layer {la}) imports {b} (layer {lb})")
        elif la == lb and pa != pb and pa in SIBLINGS and pb in SIBLINGS:
            bad.append(f"{a} imports its sibling stage {b}")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    g = _graph(runtime_only=True)  # type-only imports never run, so they close no cycle
    # a package's __init__ importing its own modules is how packages export names; a module
    # importing its package (to reach those names) is not a cycle of code
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if _is_parent(b, a)])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The checks above could pass by reading nothing: plant an upward import and see it fail."""
    fake = tmp_path / "ir"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text("def f():\n    from hiremate.api import HRockmate\n")
    monkeypatch.setitem(PACKAGE_DIRS, "hiremate.ir", fake)
    with pytest.raises(AssertionError, match="hiremate.ir.bad .* imports hiremate.api"):
        test_stages_import_downward_only()


def test_no_module_over_600_lines():
    """A module that outgrows a screenful of screens is a family that wants a subpackage."""
    long = {m: n for m, p in _modules().items()
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"
