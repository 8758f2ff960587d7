"""Reports: built from a recorder (measurements, diagnosis), written as JSON, rendered in the
terminal; the public :class:`Watch` (``redline.watch()``) adds ``report()`` to the recorder.

The names are imported lazily (on first attribute access), so a command that only renders a
trace or a plan (``redline trace``, ``redline plan``) loads ``redline.report.trace_render`` or
``plan_render`` without importing torch through :mod:`redline.report.build`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.report.build import build_report
    from redline.report.json_io import schema, to_dict, write_json
    from redline.report.terminal import print_report
    from redline.report.watch import Watch

__all__ = ["Watch", "build_report", "print_report", "schema", "to_dict", "write_json"]

_LAZY = {
    "Watch": "redline.report.watch",
    "build_report": "redline.report.build",
    "print_report": "redline.report.terminal",
    "schema": "redline.report.json_io",
    "to_dict": "redline.report.json_io",
    "write_json": "redline.report.json_io",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'redline.report' has no attribute {name!r}")
