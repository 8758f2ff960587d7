"""Diagnosis: every rule and threshold, one function per finding id (design catalogue in
:data:`redline.core.findings.CATALOGUE`), over a watch's measurements or a trace analysis.

The names are loaded on first use (PEP 562), so diagnosing a trace
(:mod:`redline.diagnose.trace_rules`) does not load the rules over a watch's measurements."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

    from redline.diagnose.advise import (
        MeasuredLoader,
        with_loader_not_tuned,
        with_measured_loader,
    )
    from redline.diagnose.engine import (
        NOT_DIAGNOSED,
        RANK_RULES,
        RULES,
        diagnose,
        diagnose_ranks,
    )
    from redline.diagnose.limits import remaining_limits
    from redline.diagnose.stall import stall_note
    from redline.diagnose.trace_rules import JOB_RULES, TRACE_RULES, diagnose_trace

__all__ = [
    "JOB_RULES", "NOT_DIAGNOSED", "RANK_RULES", "RULES", "TRACE_RULES", "MeasuredLoader",
    "diagnose", "diagnose_ranks", "diagnose_trace", "remaining_limits", "stall_note",
    "with_loader_not_tuned", "with_measured_loader",
]

_MODULES = {
    "advise": ["MeasuredLoader", "with_loader_not_tuned", "with_measured_loader"],
    "engine": ["NOT_DIAGNOSED", "RANK_RULES", "RULES", "diagnose", "diagnose_ranks"],
    "limits": ["remaining_limits"],
    "stall": ["stall_note"],
    "trace_rules": ["JOB_RULES", "TRACE_RULES", "diagnose_trace"],
}
_LAZY = {name: f"redline.diagnose.{module}" for module, names in _MODULES.items()
         for name in names}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'redline.diagnose' has no attribute {name!r}")
