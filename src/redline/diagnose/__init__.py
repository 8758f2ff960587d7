"""Diagnosis: every rule and threshold, one function per finding id (design catalogue in
:data:`redline.core.findings.CATALOGUE`), over a watch's measurements or a trace analysis."""

from redline.diagnose.advise import MeasuredLoader, with_loader_not_tuned, with_measured_loader
from redline.diagnose.engine import (
    JOB_RULES,
    NOT_DIAGNOSED,
    RANK_RULES,
    RULES,
    TRACE_RULES,
    diagnose,
    diagnose_ranks,
    diagnose_trace,
)
from redline.diagnose.limits import remaining_limits
from redline.diagnose.stall import stall_note

__all__ = [
    "JOB_RULES", "NOT_DIAGNOSED", "RANK_RULES", "RULES", "TRACE_RULES", "MeasuredLoader",
    "diagnose", "diagnose_ranks", "diagnose_trace", "remaining_limits", "stall_note", "with_loader_not_tuned",
    "with_measured_loader",
]
