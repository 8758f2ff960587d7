"""Reports, presentation only: a run's report written as JSON and rendered in the terminal,
and every document rendered as HTML. What measures and diagnoses a run into a report
(:func:`redline.runs.build_report`), the public :class:`~redline.runs.watch.Watch`, the ranks'
exchange and the metrics server live in :mod:`redline.runs`.

The names are imported lazily (on first attribute access), so a command that only renders a
trace or a plan (``redline trace``, ``redline plan``) loads ``redline.report.trace_render`` or
``plan_render`` and not the renderers of a run's report.
"""

from __future__ import annotations

from redline._lazy import lazy_attributes

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from redline.report.json_io import schema, to_dict, write_json
    from redline.report.terminal import print_report

__all__ = ["print_report", "schema", "to_dict", "write_json"]

_LAZY = {
    "print_report": "redline.report.terminal",
    "schema": "redline.report.json_io",
    "to_dict": "redline.report.json_io",
    "write_json": "redline.report.json_io",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
