"""The package's layers import one way: backend <- session <- {magics, widgets}; no import cycles.

Read from the source with ``ast`` (nothing is imported), counting every import statement, also the
ones inside functions: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "tpu_interactive"

# layer -> the layers it may import (itself included). The package's top level (its __init__ and
# top-level modules: the public facade, demo, distributed) may import anything, and no layer imports it.
ALLOWED = {
    "backend": {"backend"},
    "session": {"backend", "session"},
    "magics": {"backend", "session", "magics"},
    "widgets": {"backend", "session", "widgets"},
    "testing": {"backend", "testing"},
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The innermost module of this package that ``name`` is or lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:  # `from pkg import submodule` depends on the submodule only
                sub = f"{source}.{alias.name}"
                found.add(_owner(sub) if sub in MODULES else _owner(source))
    found.discard(None)
    found.discard(module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_the_layers_are_found():
    layers = {_layer(m) for m in MODULES}
    assert set(ALLOWED) <= layers, layers
    assert len(MODULES) > 60 and sum(len(v) for v in GRAPH.values()) > 150  # the parser sees the imports


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_run_one_way(layer):
    wrong = []
    for module, targets in GRAPH.items():
        if _layer(module) != layer:
            continue
        for target in targets:
            if _layer(target) not in ALLOWED[layer]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_backend_knows_no_ipython():
    wrong = []
    for module, path in MODULES.items():
        if _layer(module) in ("backend", "session"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                wrong += [f"{module} imports {n}" for n in names if n.split(".")[0] in ("IPython", "ipywidgets")]
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_600_lines():
    # small modules; data tables live in data files (ops/cephes.json), not in Python modules
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for p in (ROOT / "tpu_interactive").rglob("*.py")}
    assert len(sizes) > 50
    assert {name: n for name, n in sizes.items() if n > 600} == {}
