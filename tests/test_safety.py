"""Safe by construction: configuration files cannot run code, no user string reaches eval/exec,
generated code never contains graph value names, and cache entries are used only for their key.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import shutil
import warnings
from pathlib import Path

import pytest
import torch

import hiremate
from hiremate.config import Config, load_config
from hiremate.errors import ConfigError, InvalidGraphError
from hiremate.ir.graph import DataNode, Graph, Op, Ref
from hiremate.composer.menu_cache import MenuCache

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ["hiremate", "graphbuilder", "partition", "solvers"]
EVIL = "x; import os; os.system('touch {marker}') #"


# -- YAML -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [
    "name: !!python/object/apply:os.system ['touch {marker}']\n",
    "!!python/object/new:os.system ['touch {marker}']\n",
    "flat: !!python/name:os.system\n",
])
def test_yaml_with_python_tags_does_not_execute(tmp_path, payload):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(payload.format(marker=marker))
    with pytest.raises(ConfigError, match="cannot read a configuration from .*evil.yaml"):
        load_config(str(path))
    assert not marker.exists()
    with pytest.raises(ConfigError):
        Config.load(path)
    assert not marker.exists()


def test_config_save_writes_plain_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    load_config("hiremate").save(path)
    assert "!!python" not in path.read_text()
    assert load_config(str(path)) == load_config("hiremate").replace()


# -- eval / exec ----------------------------------------------------------------------------------
def _calls(name_set: set[str]):
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    f = node.func
                    called = f.id if isinstance(f, ast.Name) else (
                        f.attr if isinstance(f, ast.Attribute) else None)
                    if called in name_set:
                        yield path.relative_to(ROOT).as_posix(), called, node


def test_eval_and_exec_only_in_the_executor_codegen_on_generated_text():
    """The one exec of the library runs code compiled from generated text (checked below);
    there is no eval at all."""
    found = [(p, c) for p, c, _ in _calls({"eval", "exec"})]
    assert found == [("hiremate/runtime/codegen.py", "exec")], found
    # exec's argument is the code object compiled from the emitter's ``src``
    [(_, _, node)] = [x for x in _calls({"exec"})]
    assert isinstance(node.args[0], ast.Name) and node.args[0].id == "code"
    compiles = [(p, ast.unparse(n.args[0])) for p, _, n in _calls({"compile"})
                if p.startswith("hiremate/runtime/")]
    assert compiles == [("hiremate/runtime/codegen.py", "src")]


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h) + h[:, :3]


def _rename(graph: Graph, rename) -> Graph:
    """The same graph with every value name replaced by ``rename(name)``."""
    def arg(v):
        if isinstance(v, Ref):
            return Ref(rename(v.name))
        if isinstance(v, (list, tuple)):
            return type(v)(arg(x) for x in v)
        return v

    nodes = [dataclasses.replace(n, ops=tuple(
        dataclasses.replace(o, out=rename(o.out), args=arg(o.args),
                            kwargs=tuple((k, arg(v)) for k, v in o.kwargs)) for o in n.ops))
        for n in graph.nodes]
    data = [dataclasses.replace(d, name=rename(d.name), aliases=tuple(rename(a) for a in d.aliases))
            for d in graph.data]
    meta = graph.meta
    for key in ("output_values", "grad_values"):
        if key in meta:
            meta[key] = [rename(v) if isinstance(v, str) else v for v in meta[key]]
    return Graph(nodes, data, graph.outputs, meta)


def _run(module, x):
    out = module(x)
    out.pow(2).sum().backward()
    return out.detach()


def test_malicious_value_names_never_reach_generated_code(tmp_path):
    from hiremate.runtime.executor import RematModule

    torch.manual_seed(0)
    model = Small().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    graph = hiremate.build_graph(model, x)
    marker = tmp_path / "pwned"
    names: dict[str, str] = {}

    def rename(n: str) -> str:
        return names.setdefault(n, EVIL.format(marker=marker) + f"{len(names)}\n\"'")

    evil = _rename(graph, rename)
    assert any("import os" in d.name for d in evil.data)
    module = RematModule(model, evil, hiremate.autodiff_schedule(evil))
    got = _run(module, x)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = _run(model, x)
    assert torch.equal(got, want)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert not marker.exists()
    sources = ["".join(entry[2]) for name, entry in list(linecache.cache.items())
               if str(name).startswith("<hiremate-executor-") and len(entry) == 4]
    assert sources and not any("import os" in s for s in sources)


def test_keyword_names_and_op_targets_are_validated():
    from hiremate.runtime.executor import RematModule

    model = Small().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    graph = hiremate.build_graph(model, x)
    k = next(i for i, n in enumerate(graph.nodes)
             if n.is_fwd and n.ops and n.ops[0].target.startswith("aten."))

    def with_op(op_change) -> Graph:
        nodes = list(graph.nodes)
        ops = list(nodes[k].ops)
        ops[0] = op_change(ops[0])
        nodes[k] = dataclasses.replace(nodes[k], ops=tuple(ops))
        return Graph(nodes, graph.data, graph.outputs, graph.meta)

    bad_kw = with_op(lambda o: dataclasses.replace(o, kwargs=o.kwargs + (("a=1; import os", 1),)))
    with pytest.raises(InvalidGraphError, match="not an identifier"):
        RematModule(model, bad_kw, hiremate.autodiff_schedule(bad_kw))(x)  # compiled at call
    bad_target = with_op(lambda o: dataclasses.replace(o, target="os.system"))
    with pytest.raises(InvalidGraphError, match="'os.system', which is not an operator"):
        RematModule(model, bad_target, hiremate.autodiff_schedule(bad_target))(x)


# -- cache ----------------------------------------------------------------------------------------
def test_cache_entry_is_used_only_for_its_key(tmp_path):
    cache = MenuCache(tmp_path)
    cache.put({"kind": "menu", "graph": "A"}, ["menu of A"])
    assert cache.get({"kind": "menu", "graph": "A"}) == ["menu of A"]
    # an entry copied to the place of another key (or a digest collision) is not trusted
    src = cache.path({"kind": "menu", "graph": "A"})
    dst = cache.path({"kind": "menu", "graph": "B"})
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    with pytest.warns(RuntimeWarning, match="written for another key"):
        assert cache.get({"kind": "menu", "graph": "B"}) is None
    assert not dst.exists()  # dropped, so that the re-solved entry replaces it
    assert cache.get({"kind": "menu", "graph": "A"}) == ["menu of A"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put({"kind": "menu", "graph": "B"}, ["menu of B"])
        assert cache.get({"kind": "menu", "graph": "B"}) == ["menu of B"]
