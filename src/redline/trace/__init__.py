"""Kineto / torch.profiler trace analysis (Holistic Trace Analysis definitions, checked against
its numbers on real traces)."""

from redline.trace.analyze import TraceAnalysis, analyze_paths
from redline.trace.load import TraceError, load_trace

__all__ = ["TraceAnalysis", "TraceError", "analyze_paths", "load_trace"]
