"""Traces of a CPU (gloo) job: the arrival skew comes from gloo's host-side collective
annotations, read by both loaders, when there are no collective kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from redline.diagnose import diagnose_trace
from redline.trace import analyze_paths
from redline.trace.kineto_fast import is_kineto_head
from trace_fixtures import _x, write_trace


def _events(gloo_us: list[float]) -> list[dict[str, Any]]:
    """Three 100 µs steps (the last is dropped), one all-reduce in each of the first two."""
    ev = [_x("user_annotation", f"ProfilerStep#{i + 1}", 100 * i, 100) for i in range(3)]
    ev += [_x("cpu_op", "aten::mm", 5 + 100 * i, 10) for i in range(3)]
    ev += [_x("user_annotation", "gloo:all_reduce", 90 + 100 * i - d, d)
           for i, d in enumerate(gloo_us)]
    return ev


def _kineto_layout(path: Path, events: list[dict[str, Any]], rank: int) -> Path:
    """The block layout torch.profiler's Kineto writes (the loader's fast path reads it)."""
    blocks = "\n  },\n  {\n    ".join(json.dumps(e)[1:-1] for e in events)
    head = '{\n  "schemaVersion": 1,\n  "distributedInfo": {"rank": ' + str(rank)
    path.write_text(head + ', "world_size": 2},\n  "traceEvents": [\n  {\n    ' + blocks
                    + "\n  }\n]\n}")
    return path


@pytest.mark.parametrize("layout", ["json", "kineto"])
def test_the_rank_with_the_shortest_host_collectives_arrived_last(tmp_path: Path,
                                                                   layout: str) -> None:
    # all ranks leave an all-reduce together: rank 0 waited 60 µs in each, rank 1 only 5
    durations = {0: [60.0, 60.0, 60.0], 1: [5.0, 5.0, 5.0]}
    for r, d in durations.items():
        p = tmp_path / f"rank{r}.json"
        if layout == "json":
            write_trace(p, _events(d), rank=r, gz=False)
        else:
            _kineto_layout(p, _events(d), r)
        assert is_kineto_head(p.read_bytes()) == (layout == "kineto")
    a = analyze_paths([tmp_path])
    assert a.stragglers_source == "host"
    assert a.stragglers_window_us == 200.0  # the two kept steps
    s = {x.rank: x for x in a.stragglers}
    assert (s[1].collectives, s[1].last_arrivals, s[1].mean_lateness_us) == (2, 2, 55.0)
    assert s[0].mean_lateness_us == 0.0
    (f,) = [f for f in diagnose_trace(a) if f.id == "straggler"]
    assert f.evidence["rank"] == 1 and f.evidence["source"] == "host"
    assert f.evidence["share_of_window"] == pytest.approx(110 / 200)


def test_equal_host_collectives_name_no_straggler(tmp_path: Path) -> None:
    for r in (0, 1):
        write_trace(tmp_path / f"rank{r}.json", _events([20.0, 20.0, 20.0]), rank=r, gz=False)
    a = analyze_paths([tmp_path])
    assert a.stragglers_source == "host"
    assert not [f for f in diagnose_trace(a) if f.id == "straggler"]


def test_one_rank_has_no_skew_to_read(tmp_path: Path) -> None:
    a = analyze_paths([write_trace(tmp_path / "r.json", _events([60.0, 5.0]), rank=0)])
    assert a.stragglers_source is None and a.stragglers == []


def _report_with_trace() -> Any:
    from factories import measurements
    from redline.core.report import Report, TraceSummary

    return Report(schema="redline.report/2", redline_version="0", torch_version="0", created_utc="now",
                  command=None, status="completed", status_detail=None, measurements=measurements(),
                  findings=[], trace=TraceSummary(path="t", steps=5, device_events=0, window_us=None,
                                                  idle_pct=None, compute_pct=None, non_compute_pct=None,
                                                  note="CPU-only trace"))


def test_rank_zero_analyses_the_traces_it_can_read_and_names_the_others(tmp_path: Path) -> None:
    from redline.runs.ranks import _job_trace

    paths = {}
    for r, d in {0: [60.0, 60.0, 60.0], 1: [5.0, 5.0, 5.0]}.items():
        paths[r] = str(write_trace(tmp_path / f"redline-trace-rank{r}.json", _events(d),
                                   rank=r, gz=False))
    got = {0: {"trace_path": paths[0], "host": "a"}, 1: {"trace_path": paths[1], "host": "a"},
           2: {"trace_path": str(tmp_path / "elsewhere" / "redline-trace-rank2.json"),
               "host": "b"}}
    report, findings = _job_trace(_report_with_trace(), [], got)
    note = report.trace.note
    assert note.startswith("CPU-only trace; 2 of 3 ranks' traces analysed together")
    assert "rank(s) 2 (b) wrote theirs on another host" in note
    assert "rank 1 arrives last at 2 of 2 gloo's host-side collectives, 0.1 ms late" in note
    (f,) = findings  # no live straggler: the trace's becomes the finding, with its rank
    assert f.id == "straggler" and f.rank == 1
    # one trace here: said, and nothing analysed
    report, findings = _job_trace(_report_with_trace(), [], {0: got[0], 2: got[2]})
    assert "1 of 2 ranks' traces on this host: not analysed together" in report.trace.note
    assert findings == []
