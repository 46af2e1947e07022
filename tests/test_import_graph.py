"""mindgrpo's imports run one way, read from the source with ``ast``: every import counts, also one inside a function
or under ``if TYPE_CHECKING`` (deferring an import hides its cost, not the dependency).

A unit is a top-level module (``mindgrpo/choices.py``) or package (``mindgrpo/models/``). The layers, lowest first,
and what puts each where it is:

0. the leaves: ``mindgrpo`` (the package's ``__init__``: start-up settings and names loaded on first use), ``_env``,
   ``_io``, ``_lazy``, ``_lean_import``, ``_spec``, ``workers``, ``stamped``, ``choices`` (every named choice a config
   key accepts) and ``hf_config`` (a model's shape from its ``config.json``, its weight shapes, whether it is VL).
   They import no package, so every package may read them.
1. ``parallel`` and ``ops``: the runtime, tensor-parallel layouts, collectives and regions, and the custom kernels.
   They know nothing of a run: ``parallel`` reads ``hf_config``, ``ops`` the choices.
2. ``config``: what a run is, its settings, checked against the choices and, through ``parallel``'s ``TPLayout``,
   against the model's shape.
3. ``rewards``, ``data`` and ``tools``: what a run is given. ``data`` reads the answer normaliser of ``rewards``;
   ``tools`` reads ``data``'s tool-call format and tokenizer, and ``parallel``'s groups (one rank of a
   tensor-parallel group answers the tool calls).
4. ``algorithm``: GRPO's math, the advantages, KL and the loss (``config``'s ``LossConfig``, ``ops``' fused kernel).
5. ``models``: Qwen2.5 and Qwen2.5-VL, weights, passes and the vision tower (the scorer's log-softmax is
   ``algorithm``'s, a prompt's image pixels ``data``'s).
6. ``rollout``: the sampling engines, over ``models``.
7. ``train``: a run, on everything below.
8. ``apps``: the programs.
9. ``cli`` and ``__main__``: the command line, which loads each program by name.

A unit imports its own layer or lower ones, never a higher one, and no two units import each other, directly or
round a longer circle. Inside ``models`` the modules form no circle either: the model imports its passes, the passes
the blocks, the blocks nothing of the model.
"""
import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[1] / "mindgrpo"

LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("mindgrpo", "_env", "_io", "_lazy", "_lean_import", "_spec", "workers", "stamped", "choices", "hf_config"),
    ("parallel", "ops"),
    ("config",),
    ("rewards", "data", "tools"),
    ("algorithm",),
    ("models",),
    ("rollout",),
    ("train",),
    ("apps",),
    ("cli", "__main__"),
)
LAYER = {unit: index for index, units in enumerate(LAYERS) for unit in units}

Edge = Tuple[str, str, str]  # (importing module, imported module, "file:line")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_edges(root: Path) -> List[Edge]:
    """Every import of a package module by a module of the package ``root``: the imported name resolved to the
    module that defines it (``from mindgrpo.models import qwen2`` is the module ``mindgrpo.models.qwen2``;
    ``from mindgrpo.models.qwen2 import build_model`` is ``mindgrpo.models.qwen2``)."""
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    known = {module_name(p, root) for p in files}
    top = root.name

    def defining(name: str) -> str:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    edges: List[Edge] = []
    for path in files:
        me = module_name(path, root)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    parents = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parents + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            for name in names:
                if name == top or name.startswith(top + "."):
                    target = defining(name)
                    if target != me:
                        edges.append((me, target, where))
    return edges


def unit(module: str) -> str:
    """``mindgrpo.models.qwen2`` -> ``models``; ``mindgrpo`` -> ``mindgrpo`` (the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def evidence(edges: List[Edge], members: List[str], key) -> List[str]:
    """An import (its first) for each arrow between ``members`` (``key`` maps a module to its node)."""
    inside, first = set(members), {}
    for a, b, where in sorted(edges, key=lambda edge: edge[2]):
        if key(a) in inside and key(b) in inside and key(a) != key(b):
            first.setdefault((key(a), key(b)), where)
    return [f"{a} -> {b} ({where})" for (a, b), where in sorted(first.items())]


EDGES = import_edges(PACKAGE)


def test_every_unit_has_a_layer():
    units = {unit(module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert not units - set(LAYER), f"units without a layer (add them to LAYERS and the docstring): {units - set(LAYER)}"
    assert not set(LAYER) - units, f"LAYERS names units that do not exist: {set(LAYER) - units}"


def test_nothing_imports_a_higher_layer():
    upward = sorted({f"{where}: {a} (layer {LAYER[unit(a)]}) imports {b} (layer {LAYER[unit(b)]})"
                     for a, b, where in EDGES if LAYER[unit(b)] > LAYER[unit(a)]})
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_circle_between_units():
    graph: Dict[str, Set[str]] = {}
    for a, b, _ in EDGES:
        if unit(a) != unit(b):
            graph.setdefault(unit(a), set()).add(unit(b))
    found = cycles(graph)
    assert not found, "\n".join(f"units {c} import each other:\n  " + "\n  ".join(evidence(EDGES, c, unit))
                                for c in found)


def test_no_circle_inside_models():
    graph: Dict[str, Set[str]] = {}
    for a, b, _ in EDGES:
        if unit(a) == unit(b) == "models":
            graph.setdefault(a, set()).add(b)
    found = cycles(graph)
    assert not found, "\n".join(f"modules {c} import each other:\n  " + "\n  ".join(evidence(EDGES, c, str))
                                for c in found)


def test_the_reader_sees_imports_inside_functions_relative_ones_and_names_of_modules(tmp_path):
    """The checks above are only as good as the reader: a hidden import must count."""
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "leaf.py").write_text("VALUE = 1\n")
    (package / "high.py").write_text("def later():\n    from pkg.low.leaf import VALUE\n    return VALUE\n")
    (package / "low" / "up.py").write_text("from .. import high\nfrom . import leaf\n")
    (package / "low" / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    import pkg.high\n")
    found = {(a, b) for a, b, _ in import_edges(package)}
    assert found == {("pkg.high", "pkg.low.leaf"), ("pkg.low.up", "pkg.high"), ("pkg.low.up", "pkg.low.leaf"),
                     ("pkg.low.typed", "pkg.high")}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
