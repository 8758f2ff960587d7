"""Module attributes imported on first use (PEP 562), so that importing a package costs only
what its caller uses: ``redline.trace`` runs without torch, and the cache's writer process
imports ``redline.data.lmdb_env`` alone."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~5 ms at start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def lazy_attributes(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name in ``where`` is imported from the
    module it maps to when first asked for."""

    def __getattr__(name: str) -> Any:
        if name in where:
            import importlib

            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
