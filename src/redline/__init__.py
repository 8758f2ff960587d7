"""redline: measure, diagnose and fix under-used accelerators in PyTorch training."""

from redline._version import __version__
from redline.measure.config import WatchConfig
from redline.measure.watch import Watch, watch
from redline.report.model import Finding, Report

__all__ = ["Finding", "Report", "Watch", "WatchConfig", "__version__", "watch"]
