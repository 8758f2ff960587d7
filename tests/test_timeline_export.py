"""`--timeline PATH` / `redline.watch(timeline_path=)`: the steps as a Chrome-trace JSON for
Perfetto UI — checked against the Trace Event Format's required fields, read back with
redline's own trace reader, its numbers the watch's own; device counters from NVML readings."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import redline
from factories import FakeNvml
from html_docs import embedded
from redline.measure.nvml import NvmlSampler
from redline.measure.step_record import PHASES
from redline.report.html import render_html
from redline.report.json_io import to_dict
from redline.report.perfetto import chrome_trace, rank_timeline
from redline.runs.build import step_timeline
from redline.trace.load import load_trace

SCRIPTS = Path(__file__).parent / "scripts"


def _train(timeline: Path, steps_per_epoch: int = 40) -> redline.Watch:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8 * steps_per_epoch, 16),
                         torch.randint(0, 4, (8 * steps_per_epoch,)))
    with redline.watch(warmup_steps=3, count_flops=False, timeline_path=str(timeline),
                       sample_interval_s=0.02) as w:
        for x, y in DataLoader(data, batch_size=8):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return w


def _check_format(doc: dict[str, Any]) -> None:
    """The Trace Event Format's required fields, event type by event type."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        assert e["ph"] in ("X", "C", "M"), e
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["dur"], int | float), e
            assert e["dur"] >= 0
        elif e["ph"] == "C":  # counters: every argument is a number
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values()), e
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name",
                                 "thread_sort_index") and isinstance(e["args"], dict), e


def test_the_timeline_holds_every_step_and_its_phases_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "timeline.json"
    w = _train(path)
    w.report(show=False)
    assert w.timeline_written == path
    doc = json.loads(path.read_text())
    _check_format(doc)
    events = doc["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert list(threads.values()) == ["steps", *PHASES, "other"]
    steps = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert len(steps) == len(w.steps) == 40
    t0 = w.steps[0].start_s
    for e, s in zip(steps, w.steps, strict=True):
        assert e["name"] == f"ProfilerStep#{s.index}"
        assert e["args"]["kind"] == s.kind and e["args"]["samples"] == 8
        assert e["ts"] == pytest.approx((s.start_s - t0) * 1e6, abs=2)
        assert e["dur"] == pytest.approx(s.step_s * 1e6, abs=0.01)
        assert e["args"]["step_ms"] == pytest.approx(s.step_s * 1e3, abs=1e-3)
        for phase, secs in s.phase_s.items():
            assert e["args"][f"{phase}_ms"] == pytest.approx(secs * 1e3, abs=1e-3)
        # each phase's slice on its track: the step's total, starting where the step starts;
        # with 'other' they add up to the step
        mine = [p for p in events if p["ph"] == "X" and p["tid"] > 0
                and p["args"]["step"] == s.index]
        assert all(p["ts"] == e["ts"] for p in mine)
        assert sum(p["dur"] for p in mine) == pytest.approx(e["dur"], abs=0.01)
        assert {threads[p["tid"]] for p in mine} >= {"data_wait", "forward", "backward",
                                                      "optimizer"}
    assert [e["args"]["kind"] for e in steps[:4]] == ["warmup"] * 3 + ["measured"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"step time ms", "data wait share", "CPU cores, training process"} <= counters
    # redline's own trace reader takes the steps as profiler steps, at the same times
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file says its rank: no fallback warning
        trace = load_trace(path)
    read = [ev for ev in trace.events if ev.name.startswith("ProfilerStep#")]
    assert [(ev.name, ev.ts, ev.end - ev.ts) for ev in read] == [
        (e["name"], e["ts"], pytest.approx(e["dur"], abs=1e-3)) for e in steps]


class _NoMemoryNvml(FakeNvml):
    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        raise RuntimeError("not supported")  # a reading that fails is left out, not zero


def test_nvml_readings_become_counter_tracks_at_their_times(tmp_path: Path) -> None:
    w = _train(tmp_path / "t.json", steps_per_epoch=5)
    w.nvml = NvmlSampler(0, 1.0, _NoMemoryNvml())  # type: ignore[arg-type]
    w.nvml.sample()
    w.nvml.sample()
    tl = rank_timeline(w)
    assert [v for _, v in tl["counters"]["GPU utilization %"]] == [80.0, 80.0]
    assert [v for _, v in tl["counters"]["GPU power W"]] == [250.0, 250.0]
    assert [v for _, v in tl["counters"]["SM clock MHz"]] == [1980.0, 1980.0]
    assert "GPU memory used GiB" not in tl["counters"]
    doc = chrome_trace([tl])
    _check_format(doc)
    power = [e for e in doc["traceEvents"] if e["name"] == "GPU power W"]
    assert [e["args"]["value"] for e in power] == [250.0, 250.0]
    assert power[0]["ts"] < power[1]["ts"]
    # the report's timeline carries them too, and the HTML report draws them over time
    steps_tl = step_timeline(w)
    assert steps_tl is not None
    util = steps_tl.counters["GPU utilization %"]
    assert [v for _, v in util] == [80.0, 80.0] and util[0][0] < util[1][0]
    pytest.importorskip("plotly", reason="plotly (redline[html]) not installed")
    report = json.loads(json.dumps(to_dict(w.report(show=False))))
    assert report["timeline"]["counters"]["GPU power W"] == [
        [t, v] for t, v in steps_tl.counters["GPU power W"]]
    charts = embedded(render_html([report]), "redline-charts").values()
    drawn = {f["layout"]["title"]["text"]: f["data"][0] for f in charts}
    for name in ("GPU utilization %", "GPU power W", "SM clock MHz"):
        assert drawn[name]["y"] == [v for _, v in steps_tl.counters[name]]


def test_doctor_writes_the_timeline_and_refuses_a_path_it_could_not_write(
        tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "10",
                        "--no-flops", "--timeline", str(path), "--", "python",
                        str(SCRIPTS / "scrapes_itself.py"), "0"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    # doctor stops the script after its 10 measured steps, before its own scrape (step 21)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"timeline written to {path}" in p.stderr
    doc = json.loads(path.read_text())
    _check_format(doc)
    kinds = [e["args"]["kind"] for e in doc["traceEvents"]
             if e["ph"] == "X" and e["tid"] == 0]
    assert kinds.count("measured") == 10
    bad = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--timeline",
                          str(tmp_path / "missing" / "t.json"), "--", "python",
                          str(SCRIPTS / "scrapes_itself.py"), "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--timeline" in bad.stderr and "does not exist" in bad.stderr
