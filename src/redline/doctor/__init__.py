"""``redline doctor``: an unmodified script run under a watch, and its report.

Names are imported on first use, so that reading :class:`DoctorOptions` (the command line's
defaults) does not import the runner and torch with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.doctor.options import DoctorError, DoctorOptions
    from redline.doctor.runner import DoctorResult, run_doctor

__all__ = ["DoctorError", "DoctorOptions", "DoctorResult", "run_doctor"]

_WHERE = {"DoctorError": "options", "DoctorOptions": "options", "DoctorResult": "runner",
          "run_doctor": "runner"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'redline.doctor' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"redline.doctor.{_WHERE[name]}"), name)
