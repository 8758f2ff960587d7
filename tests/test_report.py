"""The JSON report: schema-valid, atomic, no NaN; the terminal report renders."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import jsonschema
import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from redline.report.json_io import schema, to_dict, write_json
from redline.report.terminal import print_report


@pytest.fixture(scope="module")
def report() -> redline.Report:
    ds = TensorDataset(torch.randn(320, 16), torch.randint(0, 3, (320,)))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(warmup_steps=2) as w:
        for x, y in DataLoader(ds, batch_size=32):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.report(show=False)


def test_report_validates_against_schema(report: redline.Report) -> None:
    d = to_dict(report)
    jsonschema.validate(d, schema())
    assert d["schema"] == "redline.report/2"
    m = d["measurements"]
    assert m["timing"]["steps_measured"] == 10 - 2 - 1
    assert m["config"] == {
        "device": "cpu", "batch_size": 32,
        "loader": {"num_workers": 0, "prefetch_factor": None, "pin_memory": False,
                   "persistent_workers": False},
        "precision": "fp32",
        "torch_threads": torch.get_num_threads(), "data_source": "DataLoader"}
    assert m["tier"]["tier"] == "cpu"
    assert m["mfu"]["mfu"] is None and "CPU" in m["mfu"]["reason"]
    # FLOPs of one step were counted: 3 × (2·32·16·32 + 2·32·32·3) minus the input-grad GEMM
    # of the first layer (its input needs no gradient).
    fwd = 2 * 32 * 16 * 32 + 2 * 32 * 32 * 3
    assert m["mfu"]["flops_per_step"] == 3 * fwd - 2 * 32 * 16 * 32
    assert sum(p["fraction"] for p in m["breakdown"]) == pytest.approx(1.0, abs=1e-6)
    assert set(m["sources"]) >= {"step_time", "data_wait", "cpu", "mfu"}
    assert m["loaders"][0]["settings"] == m["config"]["loader"]


def test_memory_curves_and_drift_sections_in_the_json(report: redline.Report) -> None:
    m = to_dict(report)["measurements"]
    main = m["memory"]["curves"][0]
    assert (main["kind"], main["process"], main["pid"]) == ("host_rss", "main", os.getpid())
    assert len(main["bytes"]) == len(main["t_s"]) == len(main["steps"]) >= 2
    assert main["steps"] == sorted(main["steps"]) and main["steps"][-1] == 10
    assert main["peak_bytes"] >= max(main["bytes"])  # the peak over every sample kept
    assert m["drift"] is None  # 10 steps: fewer than start-up and trends need
    d = to_dict(report)
    d["measurements"]["memory"]["curves"][0]["kind"] = "swap"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, schema())


def test_schema_rejects_a_broken_report(report: redline.Report) -> None:
    d = to_dict(report)
    d["measurements"]["timing"]["steps_total"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, schema())


def test_write_is_atomic_and_never_half_written(report: redline.Report, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "r.json"
    dest.write_text("previous")
    import redline.report.json_io as jio

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jio.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        write_json(report, dest)
    assert dest.read_text() == "previous"
    assert list(tmp_path.iterdir()) == [dest]  # the temporary file is gone
    monkeypatch.undo()
    write_json(report, dest)
    assert json.loads(dest.read_text())["status"] == "completed"


def test_nan_becomes_null(report: redline.Report) -> None:
    report.measurements.timing.step_time_mean_s = math.nan
    try:
        assert to_dict(report)["measurements"]["timing"]["step_time_mean_s"] is None
    finally:
        report.measurements.timing.step_time_mean_s = 0.0


def test_terminal_report_shows_breakdown_and_findings(report: redline.Report) -> None:
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=140))
    out = buf.getvalue()
    assert "Where each step's time goes" in out
    for phase in ("data_wait", "forward", "backward", "optimizer", "other"):
        assert phase in out
    assert "MFU unknown" in out
    assert "not measured: device time" in out
