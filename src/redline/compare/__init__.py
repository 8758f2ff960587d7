"""Two runs compared: a verdict (regression, improvement, no significant change) tested against
each run's own step-time spread, then the phases, findings, host metrics, kernels and operators
that changed. Reads redline's JSON documents and Kineto traces; no torch."""

from redline.compare.inputs import compare_paths
from redline.compare.model import (
    IMPROVEMENT,
    NO_CHANGE,
    REGRESSION,
    UNKNOWN,
    CompareInputError,
    Comparison,
    Difference,
    FindingChange,
    MetricDelta,
    OpDelta,
    PhaseDelta,
    StepTest,
    Verdict,
)
from redline.compare.plan import compare_plan
from redline.compare.reports import compare_reports
from redline.compare.traces import compare_traces

__all__ = ["IMPROVEMENT", "NO_CHANGE", "REGRESSION", "UNKNOWN", "CompareInputError",
           "Comparison", "Difference", "FindingChange", "MetricDelta", "OpDelta", "PhaseDelta",
           "StepTest", "Verdict", "compare_paths", "compare_plan", "compare_reports",
           "compare_traces"]
