"""Measurement: the recorder and its hooks, samplers, step-time statistics and MFU.

The names below are imported lazily, so ``redline.measure.config`` loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.measure.config import WatchConfig
    from redline.measure.recorder import Recorder
    from redline.measure.stats import percentile, span_fraction, step_times, wall_seconds
    from redline.measure.summary import build_measurements

_LAZY = {
    "WatchConfig": "config", "Recorder": "recorder", "build_measurements": "summary",
    "percentile": "stats", "span_fraction": "stats", "step_times": "stats",
    "wall_seconds": "stats",
}

__all__ = [
    "Recorder", "WatchConfig", "build_measurements", "percentile", "span_fraction",
    "step_times", "wall_seconds",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"redline.measure.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'redline.measure' has no attribute {name!r}")
