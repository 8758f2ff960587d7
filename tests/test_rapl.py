"""RAPL energy counters: packages summed, sub-domains not double counted, wraps handled."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.measure.rapl import RaplMeter


def test_rapl_reads_packages_and_wraps(tmp_path: Path) -> None:
    for pkg, e in (("intel-rapl:0", 999_000_000), ("intel-rapl:1", 5_000_000)):
        d = tmp_path / pkg
        d.mkdir()
        (d / "energy_uj").write_text(str(e))
        (d / "max_energy_range_uj").write_text("1000000000")
    (tmp_path / "intel-rapl:0:0").mkdir()  # a sub-domain: must not be double counted
    meter = RaplMeter(str(tmp_path))
    assert meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000")  # wrapped: +2 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("8000000")  # +3 J
    assert meter.joules() == pytest.approx(5.0)
    missing = RaplMeter(str(tmp_path / "none"))
    assert not missing.start() and missing.joules() is None
    assert "no RAPL domains" in (missing.reason or "")
