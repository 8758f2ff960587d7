"""redline trace vs Holistic Trace Analysis 0.5.0 on the same traces: time and peak memory.

Each measurement runs in a fresh process (so peak RSS is that tool's alone), the two tools
alternate run by run (noise hits both), and the analyses timed are the same four HTA runs in
../shared/traces/run_hta.py (temporal, idle per stream for all ranks, kernel types with
overlaps, comm/compute overlap) — redline computes more in the same call (launch stats, copies,
syncs, top kernels, findings). Time = parse + analysis, after imports; peak RSS = the process.

Set-up for HTA (its own virtual environment: it brings pandas and plotly):
    python3 -m venv .venv-bench && .venv-bench/bin/pip install holistictraceanalysis==0.5.0
Run:
    .venv/bin/python benchmarks/trace_vs_hta.py [--runs 3] [--hta-python .venv-bench/bin/python]
    .venv/bin/python benchmarks/trace_vs_hta.py --big 1100   # + a generated ≥ 1 GB trace
Targets: ≥ 5× faster and ≤ 1/3 of HTA's peak memory on every shared trace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
CASES = {
    "ns_resolution (V100, 15 MB)": "ns_resolution_trace",
    "nccl_data (A100)": "nccl_parser_config",
    "sampled 2 ranks": "trace_filter",
    "alexnet cuda_sync": "critical_path/alexnet",
    "mi250 (ROCm)": "amd_trace",
}

REDLINE = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from redline.trace import analyze_paths
t = time.perf_counter()
analyze_paths([sys.argv[1]])
print(json.dumps({"s": time.perf_counter() - t,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

HTA = r"""
import json, logging, resource, sys, time, warnings
warnings.simplefilter("ignore")
from hta.configs.config import logger
logger.setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
ranks = sorted(a.t.traces.keys())
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=False)
a.get_gpu_kernel_breakdown(visualize=False, duration_ratio=0.8, num_kernels=10,
                           include_memory_kernels=True)
a.get_comm_comp_overlap(visualize=False)
s = time.perf_counter() - t
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
print(json.dumps({"s": s, "rss_mb": rss}))
"""


def run(python: str, code: str, path: Path, timeout: float) -> dict[str, float] | None:
    try:
        p = subprocess.run([python, "-c", code, str(path)], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        print(f"  ! {Path(python).name} failed on {path.name}: {p.stderr.strip()[-300:]}",
              file=sys.stderr)
        return None
    out: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hta-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--big", type=int, metavar="MB", default=0,
                    help="also generate a trace of this many MB (uncompressed) and analyse it")
    args = ap.parse_args()
    if not SHARED.exists():
        print(f"no shared traces at {SHARED}", file=sys.stderr)
        return 2
    have_hta = Path(args.hta_python).exists()
    if not have_hta:
        print(f"HTA interpreter {args.hta_python} not found: redline only (see set-up above)")
    me = sys.executable
    print(f"{'trace':<28} {'redline s':>10} {'HTA s':>8} {'faster':>7} "
          f"{'redline MB':>11} {'HTA MB':>8} {'memory':>7}")
    ok = True
    for label, rel in CASES.items():
        path = SHARED / rel
        ours: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for i in range(args.runs):
            order = [("r", me, REDLINE), ("h", args.hta_python, HTA)]
            if i % 2:
                order.reverse()
            for tag, py, code in order:
                if tag == "h" and not have_hta:
                    continue
                res = run(py, code, path, timeout=600)
                if res is not None:
                    (ours if tag == "r" else theirs).append(res)
        if not ours:
            ok = False
            continue
        rs = statistics.median(r["s"] for r in ours)
        rm = max(r["rss_mb"] for r in ours)
        if theirs:
            hs = statistics.median(r["s"] for r in theirs)
            hm = max(r["rss_mb"] for r in theirs)
            speed, mem = hs / rs, rm / hm
            ok &= speed >= 5 and mem <= 1 / 3
            print(f"{label:<28} {rs:>10.3f} {hs:>8.3f} {speed:>6.1f}× {rm:>11.0f} {hm:>8.0f} "
                  f"{mem:>6.0%}")
        else:
            print(f"{label:<28} {rs:>10.3f} {'-':>8} {'-':>7} {rm:>11.0f} {'-':>8} {'-':>7}")
    if args.big:
        from make_big_trace import make_big_trace

        big = ROOT / "benchmarks" / "out" / f"big-{args.big}MB.json"
        big.parent.mkdir(exist_ok=True)
        size = make_big_trace(SHARED / CASES["ns_resolution (V100, 15 MB)"], big, args.big)
        res = run(me, REDLINE, big, timeout=3600)
        if res:
            print(f"{'generated ' + f'{size / 1e9:.2f} GB':<28} {res['s']:>10.1f} {'':>8} {'':>7} "
                  f"{res['rss_mb']:>11.0f}  (streamed; memory follows the device events kept)")
        big.unlink(missing_ok=True)
    print("targets (≥ 5× faster, ≤ 1/3 of HTA's peak memory on every trace):",
          "MET" if ok and have_hta else "NOT MET" if have_hta else "not checked (no HTA)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
