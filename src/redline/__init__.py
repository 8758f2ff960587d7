"""redline: measure, diagnose and fix under-used accelerators in PyTorch training.

The top-level names are imported lazily, so ``redline.trace`` (trace analysis) runs without
importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redline._version import __version__

if TYPE_CHECKING:
    from redline.measure.config import WatchConfig
    from redline.measure.watch import Watch, watch
    from redline.report.model import Finding, Report

__all__ = ["Finding", "Report", "Watch", "WatchConfig", "__version__", "watch"]

_LAZY = {
    "WatchConfig": "redline.measure.config",
    "Watch": "redline.measure.watch",
    "watch": "redline.measure.watch",
    "Finding": "redline.report.model",
    "Report": "redline.report.model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'redline' has no attribute {name!r}")
