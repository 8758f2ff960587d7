"""Trace analysis on a hand-built trace with hand-computed answers, and bad input.

The trace (tests/trace_fixtures.py), in µs, after dropping the last ProfilerStep (kernel 6):
  stream 7: gemm [10,30) launched at 5; gemm [35,55) launched at 12; memcpy [90,100) launched at
            80; elementwise [160,180) launched at 150
  stream 9: nccl [40,70) launched at 20; nccl [110,130) launched at 30
  window [10,180) = 170; union of device time = 20+35+10+20+20 = 105 → idle 65;
  compute = 20+20+20 = 60; non-compute = 170−65−60 = 45.
  kernel types: compute alone 20+5+20 = 45; compute ∩ comm [40,55) = 15; comm alone 15+20 = 35;
  memory 10.  overlap: 15 of 50 µs of communication = 30 %.
  idle, stream 7: 35−30 = 5 kernel wait (launched at 12, before 30); 90−55 = 35 host wait
  (launched at 80, after 55); 160−100 = 60 host wait. stream 9: 110−70 = 40 other (launched at
  30, before 70; 40 ≥ 30 µs). Sum: host 95, kernel 5, other 40.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from redline.report.trace_render import render
from redline.trace import TraceError, analyze_paths, load_trace
from trace_fixtures import synthetic_events, write_trace


def test_breakdowns_match_hand_computed_answers(tmp_path: Path) -> None:
    a = analyze_paths([write_trace(tmp_path / "t.json.gz")])
    (r,) = a.ranks
    t = r.temporal
    assert t is not None
    assert (t.window_us, t.idle_us, t.compute_us, t.non_compute_us) == (170, 65, 60, 45)
    assert r.kernel_types_us == {"COMPUTATION": 45, "COMPUTATION overlapping COMMUNICATION": 15,
                                 "COMMUNICATION": 35, "MEMORY": 10}
    assert r.comm_comp_overlap_pct == pytest.approx(30.0)
    assert r.idle_by_stream == {7: {"host_wait": 95, "kernel_wait": 5, "other": 0},
                                9: {"host_wait": 0, "kernel_wait": 0, "other": 40}}
    assert r.idle_sum_over_streams == {"host_wait": 95, "kernel_wait": 5, "other": 40}
    assert r.device_name == "NVIDIA H100 80GB HBM3"


def test_plain_json_and_gzip_read_the_same(tmp_path: Path) -> None:
    a = analyze_paths([write_trace(tmp_path / "t.json", gz=False)])
    b = analyze_paths([write_trace(tmp_path / "u.json.gz")])
    assert a.ranks[0].temporal == b.ranks[0].temporal


def test_float_timestamps_exact_and_hta_rounding(tmp_path: Path) -> None:
    ev = synthetic_events(offset=0.4)  # every time becomes fractional
    p = write_trace(tmp_path / "f.json.gz", ev)
    exact = analyze_paths([p]).ranks[0].temporal
    assert exact is not None and exact.idle_us == pytest.approx(65) and exact.window_us == 170
    # HTA rounds starts up and ends down: each event loses 1 µs here.
    compat = analyze_paths([p], hta_compat=True).ranks[0].temporal
    assert compat is not None
    assert compat.compute_us == 60 - 3  # three compute kernels, 1 µs each
    assert compat.window_us == 170 - 1


def test_rank_from_distributed_info_file_name_or_default(tmp_path: Path) -> None:
    write_trace(tmp_path / "a.json.gz", rank=3)
    assert load_trace(tmp_path / "a.json.gz").rank == 3
    with pytest.warns(UserWarning, match="using rank 5 \\(from the file name\\)"):
        assert load_trace(write_trace(tmp_path / "job_rank5.json.gz", rank=None)).rank == 5
    with pytest.warns(UserWarning, match="using rank 0 \\(default\\)"):
        assert load_trace(write_trace(tmp_path / "trace.json.gz", rank=None)).rank == 0


def test_folder_of_ranks_and_duplicate_rank(tmp_path: Path) -> None:
    write_trace(tmp_path / "r0.json.gz", rank=0)
    write_trace(tmp_path / "r1.json.gz", rank=1)
    a = analyze_paths([tmp_path])
    assert [r.rank for r in a.ranks] == [0, 1]
    assert a.kernel_types_us["MEMORY"] == 20  # summed over ranks, as HTA reports it
    write_trace(tmp_path / "r1b.json.gz", rank=1)
    with pytest.raises(TraceError, match="both say they are rank 1"):
        analyze_paths([tmp_path])


def test_truncated_gzip_names_file(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json.gz")
    p.write_bytes(p.read_bytes()[:-40])
    with pytest.raises(TraceError, match=r"t\.json\.gz: the gzip stream is corrupt or truncated"):
        load_trace(p)


def test_truncated_json_says_where(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", gz=False)
    p.write_text(p.read_text()[:500])
    with pytest.raises(TraceError, match=r"t.json: not valid JSON at line 1, column \d+ .*truncated"):
        load_trace(p)


def test_not_a_trace(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(TraceError, match="expected a Chrome-trace object with a 'traceEvents'"):
        load_trace(p)
    with pytest.raises(TraceError, match="no such file or folder"):
        analyze_paths([tmp_path / "missing.json"])


def test_trace_without_gpu_events_says_so(tmp_path: Path) -> None:
    ev = [e for e in synthetic_events() if e.get("cat") in ("user_annotation", "cpu_op")]
    a = analyze_paths([write_trace(tmp_path / "cpu.json.gz", ev)])
    assert a.ranks[0].temporal is None
    assert any("no GPU events" in w for w in a.warnings)
    out = io.StringIO()
    render(a, [], out)
    text = out.getvalue()
    assert "│ None" not in text  # an unknown device is said in words
    assert "Kernel types: none (the trace holds no device kernels)" in text


def test_rocm_string_streams_and_hip_names(tmp_path: Path) -> None:
    ev = synthetic_events()
    for e in ev:
        if e.get("cat") == "cuda_runtime":
            e["name"] = e["name"].replace("cuda", "hip")
            e["args"]["stream"] = "0x0"  # ROCm runtime events carry the stream as a string
    a = analyze_paths([write_trace(tmp_path / "amd.json.gz", ev, device="AMD Instinct MI250X")])
    t = a.ranks[0].temporal
    assert t is not None and t.idle_us == 65  # runtime events are host events whatever args say


def test_gzip_of_garbage(tmp_path: Path) -> None:
    p = tmp_path / "g.json.gz"
    p.write_bytes(gzip.compress(b"\x00\x01 not json"))
    with pytest.raises(TraceError, match=r"g\.json\.gz: not"):
        load_trace(p)


def test_streaming_parse_gives_the_same_answers(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import redline.trace.load as load

    p = write_trace(tmp_path / "t.json.gz", rank=4)
    whole = analyze_paths([p]).ranks[0]
    monkeypatch.setattr(load, "STREAM_MIN_BYTES", 0)  # stream every file
    streamed = analyze_paths([p]).ranks[0]
    assert streamed.rank == 4  # metadata read from the head of the file
    assert streamed.temporal == whole.temporal
    assert streamed.kernel_types_us == whole.kernel_types_us
    p.write_bytes(p.read_bytes()[:-60])
    with pytest.raises(TraceError, match=r"t\.json\.gz: the (gzip stream|trace) is corrupt or "
                                         r"truncated"):
        load_trace(p)
    big = tmp_path / "big.json"  # plain JSON cut in the middle of the events
    write_trace(big, gz=False, rank=2)
    big.write_text(big.read_text()[:-300])
    with pytest.raises(TraceError, match=r"big\.json: the trace (breaks after event #\d+|is "
                                         r"corrupt or truncated)"):
        load_trace(big)
