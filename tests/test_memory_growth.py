"""Memory over time: a real leak (tensors kept every step) is named with its slope, process and
time to the limit, under redline.watch() and redline doctor; a flat loop and one whose memory
rises and then plateaus are not. The CUDA path runs on CPU through FAKE torch.cuda counters
(monkeypatched, labelled as such); benchmarks/gpu_check.py runs it on a real device."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from factories import measurements
from redline.core.measurements import MemoryCurve, MemoryTimeline
from redline.diagnose import diagnose
from redline.diagnose.trends import grows
from redline.measure.memory import MemorySampler, cuda_reader, memory_timeline
from redline.measure.trend import fit, samples_for_trend, two_levels
from redline.report.html_charts import report_blocks
from redline.report.json_io import schema, to_dict
from redline.report.terminal import print_report, render_memory

SCRIPTS = Path(__file__).parent / "scripts"
MIB = 2**20


@pytest.fixture(autouse=True)
def _heap_given_back() -> None:
    """The test process's freed heap given back to the system (glibc's ``malloc_trim``), as a
    training process starts. Earlier tests in the same process free hundreds of MiB that glibc
    keeps resident; a leak then reuses those pages and the RSS — what the watch reads, and
    what runs out — does not move until they are used up."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _loop(steps: int, leak_mib: float, until: int | None = None) -> redline.Report:
    ds = TensorDataset(torch.randn(steps * 8, 16), torch.randint(0, 3, (steps * 8,)))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: list[torch.Tensor] = []
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for step, (x, y) in enumerate(DataLoader(ds, batch_size=8)):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if leak_mib and (until is None or step < until):
                kept.append(torch.ones(int(leak_mib * MIB / 4)))
            time.sleep(0.01)
    return w.report(show=False)


def _main_curve(rep: redline.Report) -> MemoryCurve:
    assert rep.measurements.memory is not None
    return next(c for c in rep.measurements.memory.curves
                if c.kind == "host_rss" and c.process == "main")


def test_trend_statistics_are_robust_and_exact() -> None:
    xs = [float(i) for i in range(50)]
    ys = [3.0 + 2.0 * x for x in xs]
    for i in (5, 17, 33):
        ys[i] += 500.0  # outliers a least-squares line would follow
    line = fit(xs, ys)
    assert line is not None
    assert line.slope == pytest.approx(2.0) and line.intercept == pytest.approx(3.0)
    assert line.trend_z > 8
    rng = random.Random(1)
    flat = fit(xs, [rng.gauss(0, 1) for _ in xs])
    assert flat is not None and abs(flat.trend_z) < 3
    split = two_levels([1.0, 1.1, 0.9, 1.0, 5.0, 5.2, 4.9, 1.05])
    assert split is not None and sorted(split.high) == [4, 5, 6]
    assert split.separation > 10


def test_leak_under_watch_is_named_with_slope_process_and_time_to_limit() -> None:
    rep = _loop(250, leak_mib=1.0)
    c = _main_curve(rep)
    assert c.pid == os.getpid()
    # 1 MiB kept per step: ~1,000 MiB per 1,000 steps (the RSS includes the allocator's pages)
    assert c.slope_bytes_per_1k_steps is not None
    assert 700 * MIB < c.slope_bytes_per_1k_steps < 1400 * MIB
    assert c.end_bytes - c.start_bytes > 150 * MIB
    assert c.trend_z is not None and c.trend_z > 3
    f = next(f for f in rep.findings if f.id == "memory_growth")
    assert f.evidence["process"] == "main" and f.evidence["pid"] == os.getpid()
    assert f.evidence["limit_source"] in ("MemAvailable", "cgroup memory.max − memory.current")
    hours = f.evidence["hours_to_limit"]
    assert isinstance(hours, float) and hours > 0
    assert c.limit_bytes is not None and c.slope_bytes_per_hour is not None
    assert hours == pytest.approx((c.limit_bytes - c.end_bytes) / c.slope_bytes_per_hour,
                                  rel=1e-2, abs=1e-3)
    assert "per 1,000 steps" in f.title and f"pid {os.getpid()}" in f.title
    d = to_dict(rep)
    jsonschema.validate(d, schema())
    assert d["measurements"]["memory"]["curves"][0]["bytes"] == c.bytes
    buf = Console(record=True, width=120)
    print_report(rep, buf)
    line = next(ln for ln in buf.export_text().splitlines() if ln.startswith("memory RSS main"))
    assert "▁" in line and "█" in line and "/1k steps" in line
    blocks = report_blocks(json.loads(json.dumps(d)))
    (fig,) = [b.figure for b in blocks
              if b.figure and b.figure["layout"]["title"]["text"].startswith("Memory")]
    assert fig["data"][0]["y"] == c.bytes and fig["data"][0]["x"] == c.t_s


def test_flat_memory_and_a_plateau_never_get_it() -> None:
    flat = _loop(200, leak_mib=0)
    assert "memory_growth" not in [f.id for f in flat.findings]
    c = _main_curve(flat)
    assert abs(c.end_bytes - c.start_bytes) < 16 * MIB
    # 120 MiB kept over the first 40 steps, then nothing: rises in the window, then plateaus.
    # The RSS shows less than was kept where the allocator hands back pages freed earlier in
    # the process (still resident), hence the margin.
    plateau = _loop(260, leak_mib=3, until=40)
    c = _main_curve(plateau)
    assert c.end_bytes - c.start_bytes > 40 * MIB
    assert "memory_growth" not in [f.id for f in plateau.findings], c


@pytest.mark.slow
def test_leak_under_doctor_and_its_flat_control(tmp_path: Path) -> None:
    def doctor(steps: int, *script_args: str) -> dict:
        # doctor measures --steps steps: 250 of ~12 ms, 3 s, 15 samples of the RSS (fewer than
        # 8 in a window cannot pass the trend test however steady the climb)
        out = tmp_path / "r.json"
        p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--steps",
                            str(steps), "--json", str(out), "--", "python", "leaks_memory.py",
                            "--steps", str(steps + 20), *script_args],
                           cwd=SCRIPTS, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stderr
        data = json.loads(out.read_text())
        jsonschema.validate(data, schema())
        return data

    leak = doctor(250)
    f = next(f for f in leak["findings"] if f["id"] == "memory_growth")
    assert f["evidence"]["process"] == "main"
    main = leak["measurements"]["memory"]["curves"][0]
    assert main["process"] == "main" and main["pid"] == f["evidence"]["pid"]
    assert 700 < f["evidence"]["slope_mib_per_1k_steps"] < 1400
    flat = doctor(200, "--leak-mib", "0")
    assert "memory_growth" not in [f["id"] for f in flat["findings"]]


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, values: list[tuple[int, int]]) -> list[object]:
    """FAKE CUDA: torch.cuda.memory_allocated / memory_reserved replaced by counters that
    return ``values`` in turn (the calls' device arguments are recorded)."""
    seen: list[object] = []
    it = iter(values)
    current: list[tuple[int, int]] = [values[0]]

    def allocated(device: object = None) -> int:
        seen.append(device)
        current[0] = next(it)
        return current[0][0]

    def reserved(device: object = None) -> int:
        return current[0][1]

    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", reserved)
    return seen


def _timeline(sampler: MemorySampler, device_total: int | None) -> MemoryTimeline:
    mt = memory_timeline(sampler, t_enter=0.0, window_start=5.0, pid=1234, interval_s=1.0,
                         device_total_bytes=device_total)
    assert mt is not None
    return mt


def test_fake_cuda_device_memory_growth_is_named_with_the_device_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE CUDA counters on CPU: allocated grows 2 MiB a sample (a sample a second, 10 steps
    a second), reserved follows it in 20 MiB blocks; the host RSS is flat."""
    n = 120
    values = [(1 * 2**30 + i * 2 * MIB, 1 * 2**30 + (i * 2 * MIB // (20 * MIB) + 1) * 20 * MIB)
              for i in range(n)]
    seen = _fake_cuda(monkeypatch, values)
    step = [0]
    sampler = MemorySampler(lambda: step[0], cuda_reader(torch.device("cuda", 0)))
    for i in range(n):
        step[0] = 10 * i
        sampler.add(float(i), 500 * MIB, {})
    assert seen and all(d == torch.device("cuda", 0) for d in seen)
    total = 80 * 2**30
    mt = _timeline(sampler, total)
    kinds = {(c.kind, c.process): c for c in mt.curves}
    alloc = kinds[("cuda_allocated", "main")]
    assert alloc.slope_bytes_per_hour == pytest.approx(2 * MIB * 3600)
    assert alloc.slope_bytes_per_1k_steps == pytest.approx(2 * MIB * 100)
    assert alloc.limit_bytes == total and alloc.limit_source == "device total memory"
    assert alloc.hours_to_limit == pytest.approx((total - values[-1][0]) / (2 * MIB * 3600))
    assert grows(alloc) and grows(kinds[("cuda_reserved", "main")])
    assert not grows(kinds[("host_rss", "main")])
    m = dataclasses.replace(measurements(device="cuda"), memory=mt)
    f = next(f for f in diagnose(m) if f.id == "memory_growth")
    # both grow at one rate; reserved is the nearer to the device's total: named first
    assert f.evidence["kind"] == "cuda_reserved" and "Device memory reserved" in f.title
    assert str(f.evidence["also_2"]).startswith("cuda_allocated")
    assert "_record_memory_history" in f.fix
    assert f.evidence["curves_growing"] == 2


def test_fake_cuda_reserved_that_fills_its_cache_then_plateaus_is_not_a_leak(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE CUDA counters: the caching allocator reserves 4 GiB over the first samples of the
    window, then allocated and reserved stay flat (a warm cache)."""
    n = 100
    values = [(min(i, 20) * 200 * MIB, min(i, 20) * 200 * MIB + 2**30) for i in range(n)]
    _fake_cuda(monkeypatch, values)
    sampler = MemorySampler(lambda: 0, cuda_reader(torch.device("cuda", 0)))
    for i in range(n):
        sampler.add(float(i), 500 * MIB, {})
    mt = _timeline(sampler, 80 * 2**30)
    assert not any(grows(c) for c in mt.curves)
    assert "memory_growth" not in [f.id for f in diagnose(
        dataclasses.replace(measurements(device="cuda"), memory=mt))]


def test_a_growing_worker_is_named_by_its_pid() -> None:
    sampler = MemorySampler(lambda: 0)
    for i in range(60):
        sampler.add(float(i), 400 * MIB, {4242: 200 * MIB + i * 4 * MIB, 4243: 200 * MIB})
    mt = _timeline(sampler, None)
    assert [(c.process, c.pid) for c in mt.curves] == [("main", 1234), ("worker", 4242),
                                                       ("worker", 4243)]
    f = next(f for f in diagnose(dataclasses.replace(measurements(), memory=mt))
             if f.id == "memory_growth")
    assert f.evidence["pid"] == 4242 and "DataLoader worker pid 4242" in f.title
    assert f.evidence["slope_mib_per_1k_steps"] is None  # no step closed between samples


def test_samples_thin_to_a_uniform_sample_of_a_long_run() -> None:
    sampler = MemorySampler(lambda: 0, keep=64)
    for i in range(1000):
        sampler.add(float(i), i, {})
    # thinned at 64, 128, 256 and 512 samples seen: every 16th of the 1,000 is left
    assert sampler.stride == 16 and len(sampler.samples) == 63
    times = [s[0] for s in sampler.samples]
    assert times[0] == 0.0 and {b - a for a, b in itertools.pairwise(times)} == {16.0}


def test_the_metrics_endpoint_serves_the_memory_gauge_as_it_grows() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    import urllib.request

    def rss(url: str) -> float:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        fams = {f.name: f.samples for f in parser.text_string_to_metric_families(text)}
        (s,) = [s for s in fams["redline_memory_bytes"]
                if s.labels["kind"] == "host_rss" and s.labels["process"] == "main"]
        assert s.labels["pid"] == str(os.getpid())
        return float(s.value)

    kept: list[torch.Tensor] = []
    with redline.watch(metrics_port=0, warmup_steps=1, count_flops=False,
                       sample_interval_s=0.05) as w:
        assert w.metrics_server is not None
        time.sleep(0.2)
        before = rss(w.metrics_server.url)
        for _ in range(40):
            kept.append(torch.ones(2 * MIB // 4))  # 2 MiB, written: resident
            w.step()
        time.sleep(0.3)
        after = rss(w.metrics_server.url)
    assert after - before > 60 * MIB


def test_a_window_too_short_for_the_trend_test_says_so() -> None:
    # Mann–Kendall z of n points rising at every step: 6 points reach 2.63, 7 reach 3.0
    assert samples_for_trend(3.0) == 7
    six = fit([0.0, 1, 2, 3, 4, 5], [0.0, 1, 2, 3, 4, 5])
    assert six is not None and six.trend_z < 3.0
    sampler = MemorySampler(lambda: 0, keep=64)

    def memory_line() -> str:
        buf = Console(record=True, width=200)
        render_memory(dataclasses.replace(measurements(), memory=_timeline(sampler, None)), buf)
        return next(ln for ln in buf.export_text().splitlines()
                    if ln.startswith("memory RSS main"))

    for i in range(5, 10):  # the window starts at 5 s
        sampler.add(float(i), 400 * MIB + i * 8 * MIB, {})
    (curve,) = _timeline(sampler, None).curves
    assert curve.window_samples == 5
    assert "5 samples in the window, a trend test needs 7: measure more steps" in memory_line()
    assert "/1k steps" not in memory_line()  # a slope fitted to 5 samples is not shown
    for i in range(10, 17):
        sampler.add(float(i), 400 * MIB + i * 8 * MIB, {})
    (curve,) = _timeline(sampler, None).curves
    assert curve.window_samples == 12
    assert "a trend test needs" not in memory_line()
