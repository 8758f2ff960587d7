"""The exported names are the documented ones (docs/architecture.md, "Public API"), each
resolves, and every error redline raises on purpose derives from RedlineError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import redline
from redline.core.errors import RedlineError

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def documented() -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8").split("## Public API", 1)[1]
    rows = re.findall(r"^\| `(redline[\w.]*)` \| (.*) \|$", text, re.MULTILINE)
    return {pkg: sorted(re.findall(r"`(\w+)`", names)) for pkg, names in rows}


DOCUMENTED = documented()


def test_every_package_is_documented() -> None:
    packages = {"redline"} | {m.name for m in pkgutil.iter_modules(redline.__path__, "redline.")
                              if m.ispkg}
    assert set(DOCUMENTED) == packages


@pytest.mark.parametrize("package", sorted(DOCUMENTED))
def test_exports_are_the_documented_names(package: str) -> None:
    mod = importlib.import_module(package)
    exported = sorted(mod.__all__)
    assert exported == DOCUMENTED[package]
    for name in exported:
        assert getattr(mod, name) is not None  # lazy exports resolve too


INTERNAL_CONTROL_FLOW = {"StopMeasurement", "Terminated"}
"""Raised into the user's script to end a ``doctor`` run (the step limit, SIGTERM);
BaseExceptions on purpose, like KeyboardInterrupt, so a script's ``except Exception`` cannot
swallow them."""


def test_every_error_derives_from_redline_error() -> None:
    errors = []
    for info in pkgutil.walk_packages(redline.__path__, "redline."):
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            # a Warning subclass is a warning category (warnings.warn), never raised
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and not issubclass(obj, Warning)
                    and obj.__module__ == info.name and name not in INTERNAL_CONTROL_FLOW):
                errors.append(obj)
    assert len(errors) >= 9
    assert not [e.__qualname__ for e in errors if not issubclass(e, RedlineError)]
