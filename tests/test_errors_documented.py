"""docs/architecture.md ("Errors") names every exception class of the package, each under its
parent with its other bases, and the control-flow BaseExceptions apart."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import redline
from redline.core.errors import RedlineError

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
_ROW = re.compile(r"^(?P<indent> *)- `(?P<name>\w+)`(?: \((?P<bases>[^)]*)\))?:")


def documented_tree() -> dict[str, tuple[str | None, set[str]]]:
    """Class name → (its parent in the list, its other bases in parentheses)."""
    section = DOC.read_text(encoding="utf-8").split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    tree: dict[str, tuple[str | None, set[str]]] = {}
    stack: list[tuple[int, str]] = []
    for line in section.splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        depth = len(m["indent"]) // 2
        stack = stack[:depth]
        parent = stack[-1][1] if stack else None
        bases = set(re.findall(r"`(\w+)`", m["bases"] or ""))
        assert m["name"] not in tree, f"{m['name']} listed twice"
        tree[m["name"]] = (parent, bases)
        stack.append((depth, m["name"]))
    return tree


def package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(redline.__path__, "redline."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and not issubclass(obj, Warning) and obj.__module__ == info.name):
                found[name] = obj
    found["RedlineError"] = RedlineError
    return found


def test_every_error_class_is_in_the_tree_with_its_bases() -> None:
    tree = documented_tree()
    classes = package_exceptions()
    errors = {n: c for n, c in classes.items() if issubclass(c, RedlineError)}
    assert len(errors) >= 20
    assert set(tree) == set(errors), (f"undocumented: {sorted(set(errors) - set(tree))}; "
                                      f"documented but absent: {sorted(set(tree) - set(errors))}")
    for name, (parent, others) in tree.items():
        cls = errors[name]
        bases = {b.__name__ for b in cls.__bases__}
        if parent is None:
            assert cls is RedlineError
            continue
        assert parent in bases, f"{name} is listed under {parent}, its bases are {bases}"
        assert others == bases - {parent}, f"{name}: listed with {others}, bases are {bases}"


def test_the_control_flow_exceptions_are_named_and_are_not_errors() -> None:
    section = DOC.read_text(encoding="utf-8").split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    control = {n: c for n, c in package_exceptions().items()
               if not issubclass(c, Exception)}
    assert set(control) == {"StopMeasurement", "Terminated"}
    for name in control:
        assert f"`{name}`" in section
