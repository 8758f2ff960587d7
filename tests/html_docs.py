"""Real redline JSON documents for the HTML report's tests: a watched run that starves for data,
a tuning result of tests/scripts/tune_tiny.py, a 2-rank trace analysis, and comparisons of
reports and of traces (built once per test session)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import redline
from redline.compare import compare_paths, compare_reports
from redline.core.report import MergedMetric, RankEntry, RanksReport
from redline.diagnose import diagnose_trace
from redline.report.compare_render import to_dict as compare_dict
from redline.report.json_io import plain, to_dict
from redline.report.trace_render import to_dict as trace_dict
from redline.report.tune_render import to_dict as tune_dict
from redline.trace import analyze_paths
from redline.tune import TuneConfig, load_factory, tune
from trace_fixtures import synthetic_events, write_trace

SCRIPTS = Path(__file__).parent / "scripts"


class _SlowReads(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample waits 2 ms, as on slow storage: the loop starves for data."""

    def __len__(self) -> int:
        return 4 * 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return torch.full((16,), float(i % 7)), torch.tensor(i % 4)


@functools.cache
def report_doc() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(warmup_steps=3, count_flops=False, sample_interval_s=0.02) as w:
        for x, y in DataLoader(_SlowReads(), batch_size=4):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    d: dict[str, Any] = plain(to_dict(w.report(show=False)))
    return d


@functools.cache
def tune_doc() -> dict[str, Any]:
    factory = load_factory(str(SCRIPTS / "tune_tiny.py"))
    result = tune(factory, TuneConfig(steps_per_trial=4, rounds=1, try_compile=False,
                                      reuse=False))
    d: dict[str, Any] = plain(tune_dict(result))
    return d


@functools.cache
def trace_doc() -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="redline-html-trace-"))
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json.gz", synthetic_events(offset=rank * 3.0), rank=rank)
    analysis = analyze_paths([folder])
    d: dict[str, Any] = plain(trace_dict(analysis, diagnose_trace(analysis)))
    return d


@functools.cache
def compare_doc() -> dict[str, Any]:
    """The run's report against a copy whose steps and phases take twice as long."""
    before = report_doc()
    after = json.loads(json.dumps(before))
    timing = after["measurements"]["timing"]
    timing["step_times_s"] = [t * 2 for t in timing["step_times_s"]]
    timing["step_time_mean_s"] *= 2
    timing["throughput_samples_per_s"] /= 2
    for share in after["measurements"]["breakdown"]:
        share["mean_s"] *= 2
    d: dict[str, Any] = plain(compare_dict(compare_reports(
        before, after, before_source="run.json", after_source="slower.json")))
    return d


@functools.cache
def trace_compare_doc() -> dict[str, Any]:
    """The synthetic trace against a copy whose GEMMs take twice as long."""
    folder = Path(tempfile.mkdtemp(prefix="redline-html-trace-diff-"))
    events = synthetic_events()
    for e in events:
        if e["name"] == "sm90_xmma_gemm_f32f32" and e["cat"] == "kernel":
            e["dur"] *= 2
    before = write_trace(folder / "before.json.gz")
    after = write_trace(folder / "after.json.gz", events)
    d: dict[str, Any] = plain(compare_dict(compare_paths(str(before), str(after))))
    return d


def two_ranks_doc() -> dict[str, Any]:
    """The run's report as rank 0 of a 2-rank job whose rank 1 is slower in backward."""
    doc = json.loads(json.dumps(report_doc()))
    entries = [RankEntry(rank=r, local_rank=r, host="h", status="completed", steps_measured=20,
                         last_step=24, step_time_mean_s=0.01 + 0.004 * r, data_wait_s=0.001,
                         h2d_copy_s=None, forward_s=0.003, backward_s=0.004 + 0.004 * r,
                         optimizer_s=0.001, comm_s=0.001, comm_wait_s=0.004 * (1 - r),
                         transfer_s=0.001, throughput_samples_per_s=400.0 - 100 * r,
                         main_cpu_cores=1.0, collectives=20, last_arrivals=20 * r,
                         lateness_s=0.004 * r, caused_wait_s=0.004 * r,
                         score_vs_fastest=1.0 - 0.4 * r, score_vs_own_best=1.0)
               for r in (0, 1)]
    doc["ranks"] = dataclasses.asdict(RanksReport(
        world_size=2, missing=[], ranks=entries,
        merged={"step_time_mean_s": MergedMetric(median=0.012, slowest_rank=1, spread=0.004)},
        arrivals_source="flight recorder"))
    return doc


def embedded(page: str, element_id: str) -> Any:
    """The JSON inside ``<script type="application/json" id=element_id>`` of a page."""
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page,
                  re.S)
    assert m is not None, f"no {element_id} in the page"
    return json.loads(m.group(1))
