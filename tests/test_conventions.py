"""The written conventions (CONTRIBUTING.md, "Code") as numbers that cannot drift back: records
built by keyword, no call of seven or more positional arguments, short local names the
exception in the layers that tune, present and measure, messages that name fields rather than
flags outside ``cli/``, and a ``report/`` that presents what the layers below computed.

Each checker is run on a small source of its own first, so a checker that could not fail
would fail here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "redline"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


MODULES = dict(_modules())


# -- records are built by keyword ------------------------------------------------------------

POSITIONAL_RECORDS: dict[tuple[str, str], str] = {}
"""Dataclasses without ``kw_only=True`` (module, class) → why."""


def dataclasses_without_kw_only(tree: ast.Module) -> list[str]:
    """The classes decorated ``@dataclass`` without ``kw_only=True`` (``@record``, of
    ``core/record.py``, is keyword-only by construction)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call is not None else decorator
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name != "dataclass":
                continue
            if call is None or not any(
                    kw.arg == "kw_only" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                    for kw in call.keywords):
                found.append(node.name)
    return found


def test_the_kw_only_checker_finds_a_positional_record() -> None:
    tree = ast.parse("import dataclasses\nfrom dataclasses import dataclass\n"
                     "@dataclass\nclass A:\n    x: int\n"
                     "@dataclasses.dataclass(frozen=True)\nclass B:\n    x: int\n"
                     "@dataclass(kw_only=True)\nclass C:\n    x: int\n"
                     "@record\nclass D:\n    x: int\n")
    assert dataclasses_without_kw_only(tree) == ["A", "B"]


def test_every_record_is_keyword_only() -> None:
    found = {(module, name) for module, tree in MODULES.items()
             for name in dataclasses_without_kw_only(tree)}
    assert found == set(POSITIONAL_RECORDS), sorted(found - set(POSITIONAL_RECORDS))


# -- calls name their arguments --------------------------------------------------------------

MAX_POSITIONAL = 6
"""A call passes at most this many arguments by position: among seven or more, a swap of two
reads as valid code."""

POSITIONAL_CALLS = {
    ("report/terminal.py", "add_row"): "a table row: rich's cells are positional, in column order",
    ("report/compare_render.py", "add_row"): "a table row: rich's cells are positional",
}
"""Calls allowed more positional arguments (module, callee name) → why."""


def long_positional_calls(tree: ast.Module) -> list[tuple[str, int]]:
    """(callee name, positional arguments) of each call with more than ``MAX_POSITIONAL``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            count = sum(not isinstance(arg, ast.Starred) for arg in node.args)
            if count > MAX_POSITIONAL:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else ast.unparse(func)
                found.append((name, count))
    return found


def test_the_call_checker_counts_positional_arguments() -> None:
    tree = ast.parse("f(1, 2, 3, 4, 5, 6)\nobj.g(1, 2, 3, 4, 5, 6, 7)\n"
                     "h(1, 2, 3, 4, 5, 6, x=7, y=8)\nk(*args, 1, 2, 3, 4, 5, 6)\n")
    assert long_positional_calls(tree) == [("g", 7)]


def test_no_call_passes_seven_arguments_by_position() -> None:
    found = {(module, name): count for module, tree in MODULES.items()
             for name, count in long_positional_calls(tree)}
    assert set(found) <= set(POSITIONAL_CALLS), {
        key: count for key, count in found.items() if key not in POSITIONAL_CALLS}


# -- names say what they hold ----------------------------------------------------------------

SHORT_NAME_CEILING = 0.12
"""The most of a layer's assigned local names that may have one or two characters (``_``
aside): indices, ``e`` of an ``except``, the terms of a formula. Code whose names say what
they hold, such as httpx's and torchtitan's, measures 6-14 % by this count."""

NAMED_LAYERS = ("tune", "report", "measure")


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``function``'s body, without those of the functions defined in it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, FUNCTIONS):
            stack.extend(ast.iter_child_nodes(node))


def local_names(tree: ast.Module) -> list[str]:
    """Every name assigned inside a function (targets of ``=``, ``+=``, annotations, ``for``,
    comprehensions, ``with … as`` and ``:=``), once per function; a function defined inside
    another counts its own."""
    names: list[str] = []
    for function in ast.walk(tree):
        if not isinstance(function, FUNCTIONS):
            continue
        seen: set[str] = set()
        for node in _own_nodes(function):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.comprehension,
                                   ast.NamedExpr)):
                targets = [node.target]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets = [node.optional_vars]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store) \
                            and name.id not in seen and name.id != "_":
                        seen.add(name.id)
                        names.append(name.id)
    return names


def short_share(names: list[str]) -> float:
    """The share of ``names`` with one or two characters (leading/trailing underscores aside)."""
    return sum(len(name.strip("_")) <= 2 for name in names) / max(1, len(names))


def test_the_name_counter_counts_each_local_name_once() -> None:
    tree = ast.parse("def f(rows):\n    total = 0\n    for i, row in enumerate(rows):\n"
                     "        total += row\n    t = [x for x in rows]\n    _ = t\n"
                     "    def g():\n        n = 1\n        return n\n    return total\n")
    names = local_names(tree)
    assert sorted(names) == ["i", "n", "row", "t", "total", "x"]
    assert short_share(names) == pytest.approx(4 / 6)


@pytest.mark.parametrize("layer", NAMED_LAYERS)
def test_local_names_say_what_they_hold(layer: str) -> None:
    names = [name for module, tree in MODULES.items() if module.startswith(f"{layer}/")
             for name in local_names(tree)]
    assert len(names) > 300  # the layer was read
    assert short_share(names) <= SHORT_NAME_CEILING, (
        f"{short_share(names):.1%} of {layer}/'s local names have one or two characters")


# -- the library names fields; only cli/ names flags -----------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
COMMAND = re.compile(r"\b(redline|torchrun|docker)\b", re.IGNORECASE)
"""A flag after one of these words, in the same clause, is part of a command the user is told
to run (``redline doctor --trace``), not the name of an input of the call that raised."""
CLAUSE_END = re.compile(r";|: |(?<!\.)\. ")
"""Where a clause ends: a command's own ``...`` does not end one."""


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                # a docstring, and the attribute docstrings under fields and constants
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(id(statement.value))
    return found


def flags_named(tree: ast.Module) -> list[str]:
    """Flags in the module's strings (docstrings aside) that are neither a whole argument of a
    command line (``"--no-python"``) nor part of a command in the same string."""
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            text = "".join(str(part.value) if isinstance(part, ast.Constant) else "{}"
                           for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            text = node.value
        else:
            continue
        if FLAG.fullmatch(text):
            continue
        for match in FLAG.finditer(text):
            clause = CLAUSE_END.split(text[:match.start()])[-1]
            if not COMMAND.search(clause):
                found.append(match.group())
    return found


def test_the_flag_checker_finds_a_flag_named_as_an_input() -> None:
    tree = ast.parse('"""Set by --doc-only."""\n'
                     'def f(port):\n    """--ok in a docstring."""\n'
                     '    args = ["--no-python"]\n'
                     '    hint = "profile it (redline doctor --trace)"\n'
                     '    note = "redline doctor: the loop starves; timing it (--tune-loader)"\n'
                     '    raise ValueError(f"port {port} taken; pick another with --metrics-port")\n')
    assert flags_named(tree) == ["--tune-loader", "--metrics-port"]


def test_the_library_names_fields_and_only_cli_names_flags() -> None:
    found = {module: flags for module, tree in MODULES.items()
             if not module.startswith("cli/") and (flags := flags_named(tree))}
    assert not found


# -- report/ presents ------------------------------------------------------------------------

PRESENTED = {
    "redline.measure.step_record": "the phase names, the columns of the timelines it draws",
    "redline.measure.live": "the snapshot of the running watch's records that the live panel "
                            "draws (computed there, read here)",
    "redline.measure.trend": "how many samples a trend test needs, said beside a short curve",
    "redline.diagnose.thresholds": "the thresholds a presentation marks, the findings' own",
    "redline.compare.model": "the comparison's records and verdict names",
    "redline.compare.stats": "the t quantile of an error bar drawn around a mean",
    "redline.plan.outcome": "the plan's outcome, everything the planner's presentation shows",
    "redline.plan.search": "the search result's record type",
    "redline.tune.result": "the tuning result's record type",
    "redline.tune.knobs": "each knob's words in the printed plan line",
}
"""What ``report/`` may import of the layers that measure, diagnose, tune, plan, compare and
run (module → what it reads there). The rest of those layers computes or runs; a report only
presents what they computed."""

COMPUTING_LAYERS = ("measure", "diagnose", "data", "tune", "plan", "workloads", "compare",
                    "runs")


def imported_modules(tree: ast.Module) -> set[str]:
    """The redline modules a module imports at run time (imports under ``if TYPE_CHECKING:``
    are annotations only)."""
    typing_only = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
                   and ast.unparse(branch.test).endswith("TYPE_CHECKING")
                   for statement in branch.body for node in ast.walk(statement)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("redline.")}


def test_the_import_reader_leaves_out_annotation_imports() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nimport redline.core.report\n"
                     "if TYPE_CHECKING:\n    from redline.measure.recorder import Recorder\n"
                     "def f():\n    from redline.measure.summary import build_measurements\n")
    assert imported_modules(tree) == {"redline.core.report", "redline.measure.summary"}


def test_report_imports_only_records_and_words_of_the_computing_layers() -> None:
    used = {name for module, tree in MODULES.items() if module.startswith("report/")
            for name in imported_modules(tree)}
    computing = {name for name in used if name.split(".")[1] in COMPUTING_LAYERS}
    assert computing <= set(PRESENTED), sorted(computing - set(PRESENTED))
