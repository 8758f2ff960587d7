"""`doctor --trace` / watch(trace_dir=...): a short profiler trace, excluded from the statistics,
analysed, its findings merged into the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

import redline
from redline.measure.config import WatchConfig
from redline.report.json_io import schema, to_dict
from trace_fixtures import write_trace

SCRIPTS = Path(__file__).parent / "scripts"


def _loop(w_cfg: WatchConfig, steps: int = 14) -> redline.Watch:
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = redline.Watch(w_cfg)
    with w:
        for _ in range(steps):
            nn.functional.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 2)).backward()
            opt.step()
    return w


def test_cpu_trace_is_recorded_excluded_and_said_cpu_only(tmp_path: Path) -> None:
    w = _loop(WatchConfig(warmup_steps=2, trace_dir=str(tmp_path / "tr")))
    kinds = [s.kind for s in w.steps]
    # 2 warm-up, 1 FLOP-count step, 5 trace steps (1 wait, 1 warm-up, 3 active), then measured
    assert kinds == ["warmup"] * 2 + ["excluded"] * 6 + ["measured"] * 6
    rep = w.report(show=False)
    assert rep.trace is not None and rep.trace.path is not None
    assert Path(rep.trace.path).exists() and rep.trace.steps == 5
    assert rep.trace.idle_pct is None and "CPU-only trace" in (rep.trace.note or "")
    jsonschema.validate(to_dict(rep), schema())


def test_gpu_trace_findings_are_merged(tmp_path: Path) -> None:
    w = _loop(WatchConfig(warmup_steps=1, count_flops=False, trace_dir=str(tmp_path / "tr")))
    assert w.capture is not None
    write_trace(w.capture.path)  # stand in a recorded GPU trace (hand-built, known answers)
    rep = w.report(show=False)
    assert rep.trace is not None and rep.trace.idle_pct == pytest.approx(100 * 65 / 170)
    ids = [f.id for f in rep.findings]
    assert {"comm_not_overlapped", "h2d_copy"} <= set(ids)
    ceilings = [f.ceiling_speedup or 0 for f in rep.findings]
    assert ceilings == sorted(ceilings, reverse=True)


def test_run_ending_inside_the_trace_says_so(tmp_path: Path) -> None:
    w = _loop(WatchConfig(warmup_steps=1, count_flops=False, trace_dir=str(tmp_path / "tr")),
              steps=3)
    rep = w.report(show=False)
    assert rep.trace is not None and rep.trace.path is None
    assert "ended before the trace" in (rep.trace.note or "")


@pytest.mark.slow
def test_doctor_trace_cli(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "4", "--warmup", "2",
         "--trace", str(tmp_path / "tr"), "--json", str(out), "--", "python", "train_ok.py",
         "--epochs", "5"], cwd=SCRIPTS, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "150"})
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    assert d["trace"]["path"].endswith(".json.gz") and d["trace"]["steps"] == 5
    assert d["measurements"]["timing"]["steps_measured"] == 4
    assert "open in Perfetto" in p.stderr


@pytest.mark.slow
def test_doctor_tune_loader_names_measured_settings(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "10", "--warmup", "2",
         "--no-flops", "--tune-loader", "--json", str(out), "--", "python",
         "train_starved.py"], cwd=SCRIPTS, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "150"})
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    f = next(x for x in d["findings"] if x["id"] == "data_starvation")
    # storage-bound fetches: workers overlap the waits, several times the throughput
    assert f["evidence"]["tuned_num_workers"] >= 2, f["fix"]  # the search's reason on failure
    assert f["evidence"]["tuned_samples_per_s"] > 1.5 * f["evidence"]["baseline_samples_per_s"], \
        f["fix"]
    assert f["fix"].startswith("Measured in your loop")
    assert "num_workers=" in f["fix"]
