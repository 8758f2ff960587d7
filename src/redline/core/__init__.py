"""The model layer: what every other layer speaks in.

Findings and limits, the measurements and the report, DataLoader settings, the exception base
and atomic file writes. Nothing here imports torch or any other part of redline, so every layer
above can use it.

The names are loaded on first use (PEP 562): importing one submodule, say
``redline.core.errors``, runs this file first, and a command that needs only the errors should
not pay for building the report's and the measurements' dataclasses.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

    from redline.core.errors import RedlineError
    from redline.core.files import OutputPathError, refuse_overwriting_inputs, write_text_atomic
    from redline.core.findings import (
        CATALOGUE,
        SEVERITIES,
        Finding,
        Limit,
        ceiling_speedup,
        rank,
        severity_for,
    )
    from redline.core.loader import LoaderSettings
    from redline.core.measurements import (
        DeviceInfo,
        DeviceMetrics,
        EffectiveConfig,
        H2DMetrics,
        HostMetrics,
        LoaderReport,
        Measurements,
        MetricTier,
        MfuResult,
        NvmlSummary,
        PhaseShare,
        PrecisionInfo,
        StepTiming,
    )
    from redline.core.report import (
        SCHEMA_VERSION,
        STATUSES,
        MergedMetric,
        RankEntry,
        RanksReport,
        Report,
        TraceSummary,
    )

__all__ = [
    "CATALOGUE", "SCHEMA_VERSION", "SEVERITIES", "STATUSES", "DeviceInfo", "DeviceMetrics",
    "EffectiveConfig", "Finding", "H2DMetrics", "HostMetrics", "Limit", "LoaderReport",
    "LoaderSettings", "Measurements", "MergedMetric", "MetricTier", "MfuResult", "NvmlSummary",
    "OutputPathError", "PhaseShare", "PrecisionInfo", "RankEntry", "RanksReport", "RedlineError",
    "Report", "StepTiming", "TraceSummary", "ceiling_speedup", "rank", "refuse_overwriting_inputs",
    "severity_for", "write_text_atomic",
]

_MODULES = {
    "errors": ["RedlineError"],
    "files": ["OutputPathError", "refuse_overwriting_inputs", "write_text_atomic"],
    "findings": ["CATALOGUE", "SEVERITIES", "Finding", "Limit", "ceiling_speedup", "rank",
                 "severity_for"],
    "loader": ["LoaderSettings"],
    "measurements": ["DeviceInfo", "DeviceMetrics", "EffectiveConfig", "H2DMetrics",
                     "HostMetrics", "LoaderReport", "Measurements", "MetricTier", "MfuResult",
                     "NvmlSummary", "PhaseShare", "PrecisionInfo", "StepTiming"],
    "report": ["SCHEMA_VERSION", "STATUSES", "MergedMetric", "RankEntry", "RanksReport",
               "Report", "TraceSummary"],
}
_LAZY = {name: f"redline.core.{module}" for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'redline.core' has no attribute {name!r}")
