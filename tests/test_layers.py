"""The layer order of docs/architecture.md, held by the imports of every module (function-level
and type-checking imports included): nothing imports a higher layer, no two modules import
each other through any path of imports that run, and the bottom layers stay free of torch.

A type-checking import (under ``if TYPE_CHECKING:``) runs no code, so it is left out of the
cycle check only: ``TunePlan`` is built from the knobs' field classes while the knobs' methods
take the whole plan, a reference each way that only the type checker follows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: list[tuple[str, ...]] = [
    ("redline._version", "redline._lazy", "redline.core"),
    ("redline.trace",),
    ("redline.measure",),
    ("redline.diagnose",),
    ("redline.data",),
    ("redline.tune", "redline.workloads", "redline.plan", "redline.compare"),
    ("redline.report",),
    ("redline.runs",),
    ("redline.doctor", "redline.demo", "redline.integrations"),
    ("redline.cli", "redline"),
]
"""Bottom to top: a module may import its own layer and the ones below, never one above."""

TORCH_FREE = ("redline.core", "redline.trace", "redline.compare")
"""Layers that must load without torch (trace analysis runs on machines without it)."""


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((SRC / "redline").rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _type_checking_nodes(tree: ast.Module) -> set[ast.AST]:
    """The statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    inside: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for statement in node.body:
                inside.update(ast.walk(statement))
    return inside


def _imports(name: str, path: Path, *, type_checking: bool = True) -> set[str]:
    """Every module ``name`` imports, resolved: ``from pkg import sub`` names the submodule
    when ``pkg.sub`` is one, else the package; without those under ``if TYPE_CHECKING:`` when
    ``type_checking`` is False."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if type_checking else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
            found.update(subs or [mod])
            if subs and len(subs) < len(node.names):
                found.add(mod)
    return found


GRAPH = {m: {d for d in _imports(m, p) if d in MODULES and d != m} for m, p in MODULES.items()}
RUN_GRAPH = {m: {d for d in _imports(m, p, type_checking=False) if d in MODULES and d != m}
             for m, p in MODULES.items()}
"""The imports that run: without those under ``if TYPE_CHECKING:``."""


def layer_of(module: str) -> int:
    best = (-1, -1)  # (prefix length, layer): the longest matching prefix decides
    for i, group in enumerate(LAYERS):
        for prefix in group:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), i))
    if best[1] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")
    return best[1]


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        layer_of(m)


def test_no_import_goes_up_a_layer() -> None:
    bad = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
           for m, deps in GRAPH.items() for d in sorted(deps)
           if layer_of(d) > layer_of(m) and not m.startswith(d + ".")]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_cycle_between_modules() -> None:
    # A package's __init__ re-exporting its own submodules is not a dependency cycle: Python
    # runs the parent before any child, and the child never needs the parent's names.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in RUN_GRAPH.items()}
    assert not _cycles(graph)


def test_only_type_checking_imports_are_left_out_of_the_cycle_check(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport redline.core\n"
                      "if TYPE_CHECKING:\n    import redline.trace\n"
                      "def f():\n    import redline.measure\n")
    assert _imports("x.m", source) == {"typing", "redline.core", "redline.trace",
                                       "redline.measure"}
    assert _imports("x.m", source, type_checking=False) == {"typing", "redline.core",
                                                            "redline.measure"}


def test_the_checks_catch_what_they_are_for() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("redline.trace.load") < layer_of("redline.diagnose.engine")
    assert layer_of("redline.cli.main") == len(LAYERS) - 1
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("redline_other.module")


@pytest.mark.parametrize("prefix", TORCH_FREE)
def test_bottom_layers_do_not_import_torch(prefix: str) -> None:
    users = [m for m, p in MODULES.items() if (m == prefix or m.startswith(prefix + "."))
             and any(d == "torch" or d.startswith("torch.") for d in _imports(m, p))]
    assert not users
