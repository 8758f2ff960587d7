"""Kineto / torch.profiler trace analysis (Holistic Trace Analysis definitions, checked against
its numbers on real traces). Numbers only, and no torch import: the findings are judged by
:func:`redline.diagnose.diagnose_trace`."""

from redline.trace.analyze import RankAnalysis, TraceAnalysis, analyze_paths
from redline.trace.events import Event, RankTrace, TraceError
from redline.trace.load import load_trace, trace_files

__all__ = ["Event", "RankAnalysis", "RankTrace", "TraceAnalysis", "TraceError", "analyze_paths",
           "load_trace", "trace_files"]
