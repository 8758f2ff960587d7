"""redline trace vs Holistic Trace Analysis 0.5.0 on the same traces: time and peak memory.

Each measurement runs in a fresh process (so peak RSS is that tool's alone), the two tools
alternate run by run (noise hits both), and the analyses timed are the same four HTA runs in
../shared/traces/run_hta.py (temporal, idle per stream for all ranks, kernel types with
overlaps, comm/compute overlap) — redline computes more in the same call (launch stats, copies,
syncs, top kernels, findings). Two times per tool:
- **command**: a fresh process as users run it, imports included, timed from its start to its
  exit by this script: `redline trace PATH` (the CLI, which renders the report too) against a
  Python process that imports HTA and runs the four analyses;
- **analysis**: parse + analysis inside that kind of process, after imports.
Peak RSS = the process (the command's).

Set-up for HTA (its own virtual environment: it brings pandas and plotly):
    python3 -m venv .venv-bench && .venv-bench/bin/pip install holistictraceanalysis==0.5.0
Run:
    .venv/bin/python benchmarks/trace_vs_hta.py [--runs 3] [--hta-python .venv-bench/bin/python]
    .venv/bin/python benchmarks/trace_vs_hta.py --big 1100   # + a generated ≥ 1 GB trace
Targets: ≥ 5× faster (the command, end to end) and ≤ 1/3 of HTA's peak memory on every shared
trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
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


def median_s(rows: list[dict[str, float]]) -> float:
    return statistics.median(r["s"] for r in rows)


def command(argv: list[str], timeout: float) -> dict[str, float] | None:
    """Wall time of a fresh process from its start to its exit (imports, parse, analysis,
    output) and its peak RSS (that child's own, from wait4)."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = t + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            p.wait()
            return None
        time.sleep(0.005)
    s = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        print(f"  ! {' '.join(argv[:2])} failed: {err.strip()[-300:]}", file=sys.stderr)
        return None
    return {"s": s, "rss_mb": usage.ru_maxrss / 1024}


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
    script = Path(me).parent / "redline"  # the console script users run, else the module
    cli = [str(script), "trace"] if script.exists() else [me, "-m", "redline.cli.main", "trace"]
    print(f"{'':<28} {'command (fresh process, imports included)':^42}  "
          f"{'analysis (after imports)':^26}")
    print(f"{'trace':<28} {'redline s':>9} {'HTA s':>7} {'faster':>7} {'MB':>6} {'HTA MB':>6} "
          f"{'memory':>6}  {'redline s':>9} {'HTA s':>7} {'faster':>7}")
    ok = True
    for label, rel in CASES.items():
        path = SHARED / rel
        runs: dict[str, list[dict[str, float]]] = {"rc": [], "hc": [], "ra": [], "ha": []}
        for i in range(args.runs):
            order = ["r", "h"] if i % 2 == 0 else ["h", "r"]
            for tag in order:
                if tag == "h" and not have_hta:
                    continue
                if tag == "r":
                    cmd = command([*cli, str(path)], timeout=600)
                    ana = run(me, REDLINE, path, timeout=600)
                else:
                    cmd = command([args.hta_python, "-c", HTA, str(path)], timeout=600)
                    ana = run(args.hta_python, HTA, path, timeout=600)
                if cmd is not None:
                    runs[tag + "c"].append(cmd)
                if ana is not None:
                    runs[tag + "a"].append(ana)
        if not runs["rc"] or not runs["ra"]:
            ok = False
            continue
        rc, ra = median_s(runs["rc"]), median_s(runs["ra"])
        rm = max(r["rss_mb"] for r in runs["rc"])
        if runs["hc"] and runs["ha"]:
            hc, ha = median_s(runs["hc"]), median_s(runs["ha"])
            hm = max(r["rss_mb"] for r in runs["hc"])
            speed, mem = hc / rc, rm / hm
            ok &= speed >= 5 and mem <= 1 / 3
            print(f"{label:<28} {rc:>9.3f} {hc:>7.3f} {speed:>6.1f}× {rm:>6.0f} {hm:>6.0f} "
                  f"{mem:>6.0%}  {ra:>9.3f} {ha:>7.3f} {ha / ra:>6.1f}×")
        else:
            print(f"{label:<28} {rc:>9.3f} {'-':>7} {'-':>7} {rm:>6.0f} {'-':>6} {'-':>6}  "
                  f"{ra:>9.3f} {'-':>7} {'-':>7}")
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
    print("targets (command ≥ 5× faster end to end, ≤ 1/3 of HTA's peak memory on every trace):",
          "MET" if ok and have_hta else "NOT MET" if have_hta else "not checked (no HTA)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
