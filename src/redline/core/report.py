"""The report: the measurements, the findings ranked, and how the run ended."""

from __future__ import annotations

from dataclasses import dataclass

from redline.core.findings import Finding
from redline.core.measurements import Measurements

SCHEMA_VERSION = "redline.report/2"
"""JSON schema id of :class:`Report` (``redline/report/schema.json``)."""

STATUSES = ("completed", "step_limit", "script_error", "interrupted", "no_steps")
"""How the measured run ended."""


@dataclass(slots=True)
class TraceSummary:
    """The short profiler trace recorded by ``doctor --trace`` and what its analysis found."""

    path: str | None
    """Chrome-trace file (open it in Perfetto), None when none was written."""
    steps: int
    """Steps covered (wait + warm-up + active), excluded from the statistics."""
    device_events: int
    window_us: float | None
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    note: str | None
    """Why kernel-level numbers are missing (CPU-only trace, profiler error), if they are."""


@dataclass(slots=True)
class Report:
    schema: str
    redline_version: str
    torch_version: str
    created_utc: str
    command: list[str] | None
    status: str
    status_detail: str | None
    measurements: Measurements
    findings: list[Finding]
    trace: TraceSummary | None = None
