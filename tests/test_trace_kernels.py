"""Launch stats, copies, host syncs, top kernels, stragglers and trace findings, on the
hand-built trace of trace_fixtures.py (answers worked out in the comments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from redline.diagnose import diagnose_trace
from redline.trace import analyze_paths
from trace_fixtures import _x, synthetic_events, write_trace


def _ids(a) -> set[str]:
    return {f.id for f in diagnose_trace(a)}


def test_launch_stats_copies_and_top_kernels(tmp_path: Path) -> None:
    (r,) = analyze_paths([write_trace(tmp_path / "t.json.gz")]).ranks
    ls = r.launches
    assert ls is not None
    # kernels 1,2,4,5,8 (the memcpy is not a kernel, kernel 6 is in the dropped last step);
    # delays: 10−7, 35−14, 40−22, 160−152, 110−32 → 3, 21, 18, 8, 78 → median 18
    assert ls.launches == 5 and ls.launch_delay_us_median == 18
    assert ls.cpu_launch_us_median == 2 and ls.short_kernels == 0 and ls.delay_outliers == 0
    (cp,) = r.copies
    assert (cp.kind, cp.count, cp.total_us, cp.pageable, cp.gb_per_s) == (
        "Memcpy HtoD", 1, 10, 1, None)
    names = [k.name for k in r.top_kernels]
    assert names[0].startswith("ncclDevKernel") and names[1].startswith("sm90_xmma_gemm")
    assert r.top_kernels[0].total_us == 50
    assert r.top_kernels[0].share_of_busy == pytest.approx(50 / 105)


def test_trace_findings_with_ceilings(tmp_path: Path) -> None:
    a = analyze_paths([write_trace(tmp_path / "t.json.gz")])
    f = {x.id: x for x in diagnose_trace(a)}
    # communication alone: 50 µs of comm minus 15 overlapped = 35 of a 170 µs window
    assert f["comm_not_overlapped"].ceiling_speedup == pytest.approx(1 / (1 - 35 / 170))
    # pageable H2D copy: 10 of 170 µs
    assert f["h2d_copy"].ceiling_speedup == pytest.approx(1 / (1 - 10 / 170))
    # fp32 GEMMs (names say f32f32) on a compute-capability-9.0 GPU: 40 of 170 µs
    assert f["fp32_matmul_on_tensor_cores"].ceiling_speedup == pytest.approx(
        1 / (1 - 40 / 170 * 7 / 8))
    assert "launch_bound" not in f and "memory_bound_kernels" not in f  # 0 short; 20/60 < 40 %
    ceilings = [x.ceiling_speedup or 0 for x in diagnose_trace(a)]
    assert ceilings == sorted(ceilings, reverse=True)


def test_no_fp32_finding_without_tensor_cores(tmp_path: Path) -> None:
    a = analyze_paths([write_trace(tmp_path / "t.json.gz", cc=(7, 0))])
    assert "fp32_matmul_on_tensor_cores" not in _ids(a)


def test_host_sync_inventory_and_idle_after(tmp_path: Path) -> None:
    ev = synthetic_events()
    # the host blocks in cudaStreamSynchronize [72, 75); the device is idle from 70 to 90
    ev.append(_x("cuda_runtime", "cudaStreamSynchronize", 72, 3))
    ev.append(_x("cuda_runtime", "hipDeviceSynchronize", 156, 2))  # device idle 158 → 160
    (r,) = analyze_paths([write_trace(tmp_path / "t.json.gz", ev)]).ranks
    got = {s.name: (s.count, s.host_blocked_us, s.device_idle_after_us) for s in r.syncs}
    assert got == {"cudaStreamSynchronize": (1, 3, 15), "hipDeviceSynchronize": (1, 2, 2)}


def test_unfused_attention_and_memory_bound(tmp_path: Path) -> None:
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 1000)]
    t = 0
    for _i in range(20):  # bmm → softmax → bmm, then two elementwise kernels
        for name, dur in (("volta_sgemm_128x64_nn_bmm", 10), ("softmax_warp_forward", 30),
                          ("volta_sgemm_128x64_nn_bmm", 10),
                          ("void at::native::vectorized_elementwise_kernel", 20),
                          ("void at::native::reduce_kernel", 20)):
            corr = len(ev)
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", t, 1, correlation=corr))
            ev.append(_x("kernel", name, t + 1, dur, stream=7, correlation=corr))
            t += dur + 1
    a = analyze_paths([write_trace(tmp_path / "a.json.gz", ev, cc=(7, 0))])
    f = {x.id: x for x in diagnose_trace(a)}
    assert f["unfused_attention"].evidence["occurrences"] == 20
    assert "scaled_dot_product_attention" in f["unfused_attention"].fix
    # softmax + elementwise + reduce = 70 of 90 µs of compute per round
    assert f["memory_bound_kernels"].evidence["share_of_compute"] == pytest.approx(70 / 90, abs=1e-3)


def test_straggler_from_arrival_skew(tmp_path: Path) -> None:
    def rank_events(nccl_durs: list[int]) -> list[dict]:
        ev = [_x("user_annotation", "ProfilerStep#1", 0, 10_000)]
        t = 0
        for i, d in enumerate(nccl_durs):
            ev.append(_x("cuda_runtime", "cudaLaunchKernel", t, 1, correlation=i))
            ev.append(_x("kernel", "ncclDevKernel_AllReduce", t + 1000 - d, d, stream=9,
                         correlation=i))
            t += 1000
        return ev

    # rank 1 spends 100 µs in each all-reduce, rank 0 600: rank 1 arrives 500 µs late
    write_trace(tmp_path / "r0.json.gz", rank_events([600] * 5), rank=0)
    write_trace(tmp_path / "r1.json.gz", rank_events([100] * 5), rank=1)
    a = analyze_paths([tmp_path])
    s1 = next(s for s in a.stragglers if s.rank == 1)
    assert (s1.last_arrivals, s1.collectives, s1.mean_lateness_us) == (5, 5, 500)
    f = next(x for x in diagnose_trace(a) if x.id == "straggler")
    assert f.evidence["rank"] == 1


def test_cli_trace_terminal_and_json(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json.gz")
    out = tmp_path / "a.json"
    r = subprocess.run([sys.executable, "-m", "redline.cli.main", "trace", str(p), "--json",
                        str(out)], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "150", "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert "Where GPU time goes" in r.stdout and "comm_not_overlapped" in r.stdout
    d = json.loads(out.read_text())
    assert d["schema"] == "redline.trace/1"
    assert d["ranks"][0]["temporal"]["idle_us"] == 65
    assert d["kernel_types_us"]["MEMORY"] == 10
    bad = subprocess.run([sys.executable, "-m", "redline.cli.main", "trace",
                          str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr


def test_cuda_graph_launch_counts_all_its_kernels(tmp_path: Path) -> None:
    """One cudaGraphLaunch, one correlation id, several kernels replayed from the graph."""
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 500),
          _x("user_annotation", "ProfilerStep#2", 500, 500),
          _x("cuda_runtime", "cudaGraphLaunch", 10, 5, correlation=77)]
    for k in range(4):
        ev.append(_x("kernel", f"graph_kernel_{k}", 20 + 10 * k, 8, stream=7, correlation=77))
    ev.append(_x("cuda_runtime", "cudaGraphLaunch", 600, 5, correlation=78))  # last step
    ev.append(_x("kernel", "graph_kernel_0", 610, 8, stream=7, correlation=78))
    (r,) = analyze_paths([write_trace(tmp_path / "g.json.gz", ev)]).ranks
    assert r.device_events == 4  # the last step's replay is dropped
    assert r.launches is not None and r.launches.launches == 4
    t = r.temporal
    assert t is not None and (t.window_us, t.idle_us) == (38, 6)  # gaps of 2 µs between kernels
    assert r.idle_sum_over_streams["kernel_wait"] == 6  # launched long before: launch latency
