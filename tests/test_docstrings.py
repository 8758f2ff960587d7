"""Every exported function (each package's ``__all__``) has a Google-style docstring with an
``Args:`` entry per parameter and a ``Returns:`` (or ``Yields:``) section when it returns
something; every exported class has a docstring of its own. Ruff's pydocstyle rules
(pyproject.toml) judge the sections' form; this test requires them on the public API."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import pytest

import redline

PACKAGES = sorted({"redline"} | {m.name for m in pkgutil.iter_modules(redline.__path__, "redline.")
                                 if m.ispkg})

SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
"""A Google-style section header (``Args:``, ``Returns:``, ``Raises:`` ...) alone on its line."""


def _sections(doc: str) -> dict[str, list[str]]:
    """The docstring's sections by name, each with the lines below its header."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent = 0
    for line in doc.splitlines():
        header = SECTION.match(line)
        if header and (current is None or len(header.group(1)) <= indent):
            indent = len(header.group(1))
            current = out.setdefault(header.group(2), [])
        elif current is not None:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                current = None  # prose after the section, at the header's indent
            else:
                current.append(line)
    return out


def _documented_args(lines: list[str]) -> set[str]:
    """Names of the ``name: text`` (or ``name (type): text``) entries of an Args section."""
    entries = [line for line in lines if line.strip()]
    if not entries:
        return set()
    first = min(len(line) - len(line.lstrip()) for line in entries)
    names = set()
    for line in entries:
        if len(line) - len(line.lstrip()) == first:
            m = re.match(r"\s*(\*{0,2}\w+)\s*(\([^)]*\))?:", line)
            if m:
                names.add(m.group(1))
    return names


def _param_names(fn: Callable[..., Any]) -> list[str]:
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("self", "cls"):
            continue
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(star + p.name)
    return names


def _returns_nothing(fn: Callable[..., Any]) -> bool:
    ret = inspect.signature(fn).return_annotation
    return ret in (None, "None", type(None))


def function_problems(fn: Callable[..., Any]) -> list[str]:
    """What the docstring of ``fn`` lacks; empty when it is complete."""
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        return ["no docstring"]
    sections = _sections(doc)
    problems = []
    params = _param_names(fn)
    if params:
        if "Args" not in sections:
            problems.append("no Args section")
        else:
            documented = _documented_args(sections["Args"])
            problems += [f"Args lacks {name}" for name in params if name not in documented]
            problems += [f"Args names {name}, not a parameter" for name in sorted(documented)
                         if name not in params]
    if not _returns_nothing(fn) and not {"Returns", "Yields"} & set(sections):
        problems.append("no Returns (or Yields) section")
    return problems


def class_problems(cls: type) -> list[str]:
    """``["no docstring"]`` when ``cls`` has no docstring of its own (a dataclass's generated
    signature is not one)."""
    doc = cls.__dict__.get("__doc__")
    generated = dataclasses.is_dataclass(cls) and doc is not None \
        and doc.startswith(cls.__name__ + "(")
    return ["no docstring"] if not doc or not doc.strip() or generated else []


def _exports(package: str) -> list[tuple[str, Any]]:
    mod = importlib.import_module(package)
    return [(name, getattr(mod, name)) for name in mod.__all__]


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_functions_document_args_and_returns(package: str) -> None:
    missing = {name: function_problems(obj) for name, obj in _exports(package)
               if inspect.isfunction(obj)}
    assert {name: p for name, p in missing.items() if p} == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_classes_have_a_docstring(package: str) -> None:
    missing = [name for name, obj in _exports(package)
               if inspect.isclass(obj) and class_problems(obj)]
    assert missing == []


def test_every_package_exports_something_checked() -> None:
    checked = [obj for package in PACKAGES for _, obj in _exports(package)
               if inspect.isfunction(obj) or inspect.isclass(obj)]
    assert len(checked) >= 100


# The checker itself, on functions and classes made to lack each part.

def _complete(path: str, *names: str, limit: int | None = None, **options: Any) -> int:
    """Count something.

    Args:
        path: a file.
        *names: the names.
        limit: at most this many; None = no limit.
        **options: passed on.

    Returns:
        The count.
    """
    return 0


def _undocumented_arg(path: str, limit: int) -> int:  # noqa: D417 (the case under test)
    """Count something.

    Args:
        path: a file.

    Returns:
        The count.
    """
    return 0


def _unknown_arg(path: str) -> None:
    """Count something.

    Args:
        path: a file.
        paths: not a parameter.
    """


def _no_returns(path: str) -> int:
    """Count something.

    Args:
        path: a file.
            limit: an indented continuation, not an entry.
    """
    return 0


def _no_args(path: str) -> None:
    """Count something in ``path``."""


def _yields(path: str) -> Any:
    """Count something.

    Args:
        path: a file.

    Yields:
        Each count.
    """
    yield 0


def _bare() -> int:
    return 0


@dataclasses.dataclass(kw_only=True)
class _Generated:
    size: int


@dataclasses.dataclass(kw_only=True)
class _Documented:
    """A record."""

    size: int


@pytest.mark.parametrize(("fn", "expected"), [
    (_complete, []),
    (_yields, []),
    (_undocumented_arg, ["Args lacks limit"]),
    (_unknown_arg, ["Args names paths, not a parameter"]),
    (_no_returns, ["no Returns (or Yields) section"]),
    (_no_args, ["no Args section"]),
    (_bare, ["no docstring"]),
])
def test_checker_names_what_a_docstring_lacks(fn: Callable[..., Any], expected: list[str]) -> None:
    assert function_problems(fn) == expected


def test_checker_does_not_take_a_dataclass_signature_for_a_docstring() -> None:
    assert class_problems(_Generated) == ["no docstring"]
    assert class_problems(_Documented) == []
