"""Run every rule over the measurements and rank the findings by the gain they promise."""

from __future__ import annotations

from redline.diagnose.data import data_findings, h2d_findings
from redline.diagnose.device import device_findings
from redline.diagnose.finding import SEVERITY_RANK
from redline.diagnose.host import host_findings
from redline.report.model import Finding, Measurements


def rank(findings: list[Finding]) -> list[Finding]:
    """Largest ceiling speedup first; findings without one after, by severity."""
    return sorted(findings, key=lambda f: (f.ceiling_speedup is None,
                                           -(f.ceiling_speedup or 0.0),
                                           SEVERITY_RANK.get(f.severity, 9)))


def diagnose(m: Measurements) -> list[Finding]:
    return rank([*data_findings(m), *h2d_findings(m), *host_findings(m), *device_findings(m)])
