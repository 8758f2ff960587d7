"""redline: measure, diagnose and fix under-used accelerators in PyTorch training.

The top-level names are imported lazily, so ``redline.trace`` (trace analysis) runs without
importing torch.
"""

from __future__ import annotations

from redline._lazy import lazy_attributes
from redline._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from redline.core.errors import RedlineError
    from redline.core.findings import Finding
    from redline.core.report import Report
    from redline.measure.config import WatchConfig
    from redline.runs.watch import Watch, watch

__all__ = ["Finding", "RedlineError", "Report", "Watch", "WatchConfig", "__version__", "watch"]

_LAZY = {
    "WatchConfig": "redline.measure.config",
    "Watch": "redline.runs.watch",
    "watch": "redline.runs.watch",
    "Finding": "redline.core.findings",
    "Report": "redline.core.report",
    "RedlineError": "redline.core.errors",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
