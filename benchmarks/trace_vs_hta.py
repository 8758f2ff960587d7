"""redline trace vs Holistic Trace Analysis 0.5.0 on the same traces: time and peak memory.

Each measurement runs in a fresh process (so peak RSS is that tool's alone), the two tools
alternate run by run (noise hits both), and the analyses timed are the same four HTA runs in
../shared/traces/run_hta.py (temporal, idle per stream for all ranks, kernel types with
overlaps, comm/compute overlap) — redline computes more in the same call (launch stats, copies,
syncs, top kernels, findings). Per trace:
- **command**: a fresh process as users run it, imports included, timed from its start to its
  exit by this script: `redline trace PATH` (the CLI, which renders the report too) against a
  Python process that imports HTA and runs the four analyses; peak RSS of that process;
- **analysis**: parse + analysis inside that kind of process, after imports;
- **gunzip + parse**: for scale, the bare read of the same files in a fresh process
  (`gzip.open(...).read()` or `open(...).read()`, then `orjson.loads`), after imports: what any
  tool that parses the whole JSON pays before analysing anything.
redline's bytecode is compiled first, as pip does at install (HTA's was when it was installed).

Set-up for HTA (its own virtual environment: it brings pandas and plotly):
    python3 -m venv .venv-bench && .venv-bench/bin/pip install holistictraceanalysis==0.5.0
Run:
    .venv/bin/python benchmarks/trace_vs_hta.py [--runs 3] [--hta-python .venv-bench/bin/python]
    .venv/bin/python benchmarks/trace_vs_hta.py --big 1100   # + a generated ≥ 1 GB trace
The generated trace is written under /tmp (--big-dir) and deleted after. HTA runs there once,
under a cap on its address space (--memory-gb, default 12: the machine is shared; the bare
parse too) and a time limit (--big-timeout); when it cannot finish, the row says so, with its time and peak
memory at the stop.
Targets: the command ≥ 10× faster end to end and ≤ 1/4 of HTA's peak memory on every trace.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
CASES = {
    "ns_resolution (V100, 15 MB)": "ns_resolution_trace",
    "nccl_data (A100)": "nccl_parser_config",
    "sampled 2 ranks": "trace_filter",
    "alexnet cuda_sync": "critical_path/alexnet",
    "mi250 (ROCm)": "amd_trace",
}
SPEED_TARGET = 10.0
MEMORY_TARGET = 0.25

REDLINE = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
from redline.trace import analyze_paths
import orjson  # imported on first use by the parse of a file >= 1 MiB: an import, not analysis
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

BARE = r"""
import gzip, json, resource, sys, time
from pathlib import Path
import orjson
p = Path(sys.argv[1])
files = sorted([*p.glob("*.json"), *p.glob("*.json.gz")]) if p.is_dir() else [p]
t = time.perf_counter()
for f in files:
    with (gzip.open(f, "rb") if f.suffix == ".gz" else open(f, "rb")) as fh:
        doc = orjson.loads(fh.read())
    del doc
print(json.dumps({"s": time.perf_counter() - t,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
"""The bare read, for scale: gunzip (when gzipped) and one orjson parse of the whole file."""


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


def median_s(rows: list[dict[str, Any]]) -> float:
    return statistics.median(r["s"] for r in rows)


def command(argv: list[str], timeout: float, memory_gb: float | None = None) -> dict[str, Any]:
    """Wall time of a fresh process from its start to its exit (imports, parse, analysis,
    output) and its peak RSS (that child's own, from wait4). ``ok`` is False when it failed,
    ran out of the address space ``memory_gb`` allows, or passed ``timeout`` (then killed):
    the time and peak memory are those at the stop, and ``why`` says what stopped it."""

    def cap() -> None:
        if memory_gb is not None:
            limit = int(memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # stderr to a file, not a pipe: a chatty child cannot block on it. A blocking wait4 returns
    # at the child's exit (a polling loop adds up to its period to every run: a few % of a
    # 60 ms command); a timer kills it at the limit.
    killed = threading.Event()
    with tempfile.TemporaryFile() as errors:
        t = time.perf_counter()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors, cwd=ROOT,
                             preexec_fn=cap if memory_gb is not None else None)

        def stop() -> None:
            killed.set()
            p.kill()

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
            s = time.perf_counter() - t
        finally:
            timer.cancel()
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    why = f"killed at the {timeout:.0f} s limit" if killed.is_set() else ""
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0 and not why:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"
        why = last[-160:]
    return {"s": s, "rss_mb": usage.ru_maxrss / 1024, "ok": not why, "why": why}


def _row(label: str, rc: float, rm: float, hta: list[dict[str, Any]], bare: float | None,
         ra: float | None, ha: float | None) -> tuple[str, bool | None]:
    """One table line and whether it meets the targets (None: HTA did not finish)."""
    bare_s = f"{bare:>8.3f}" if bare is not None else f"{'-':>8}"
    ana = (f"{ra:>9.3f} {ha:>7.3f} {ha / ra:>6.1f}×" if ra and ha else
           f"{ra:>9.3f} {'-':>7} {'-':>7}" if ra else f"{'-':>9} {'-':>7} {'-':>7}")
    if not hta:
        return (f"{label:<28} {rc:>9.3f} {'-':>7} {'-':>7} {rm:>6.0f} {'-':>6} {'-':>6} "
                f"{bare_s}  {ana}"), None
    done = [h for h in hta if h["ok"]]
    if not done:
        h = hta[0]
        return (f"{label:<28} {rc:>9.3f} {'>' + format(h['s'], '.1f'):>7} {'':>7} {rm:>6.0f} "
                f"{'>' + format(h['rss_mb'], '.0f'):>6} {'':>6} {bare_s}  {ana}\n"
                f"{'':<28} HTA did not finish: {h['why']} (after {h['s']:.1f} s, peak "
                f"{h['rss_mb']:.0f} MB)"), None
    hc, hm = median_s(done), max(h["rss_mb"] for h in done)
    speed, mem = hc / rc, rm / hm
    return (f"{label:<28} {rc:>9.3f} {hc:>7.3f} {speed:>6.1f}× {rm:>6.0f} {hm:>6.0f} {mem:>6.0%} "
            f"{bare_s}  {ana}"), speed >= SPEED_TARGET and mem <= MEMORY_TARGET


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hta-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--big", type=int, metavar="MB", default=0,
                    help="also generate a trace of this many MB (uncompressed) and analyse it")
    ap.add_argument("--big-dir", type=Path, default=Path("/tmp/redline-big-trace"),
                    help="where the generated trace is written (removed after)")
    ap.add_argument("--big-timeout", type=float, default=1200.0,
                    help="seconds HTA may take on the generated trace before it is stopped")
    ap.add_argument("--memory-gb", type=float, default=12.0,
                    help="address space HTA and the bare parse may use on the generated trace "
                    "(the machine is shared)")
    ap.add_argument("--only-big", action="store_true", help="skip the shared traces")
    args = ap.parse_args()
    if not SHARED.exists():
        print(f"no shared traces at {SHARED}", file=sys.stderr)
        return 2
    have_hta = Path(args.hta_python).exists()
    if not have_hta:
        print(f"HTA interpreter {args.hta_python} not found: redline only (see set-up above)")
    me = sys.executable
    # Bytecode as an installed package has it (pip compiles at install; HTA's was): with
    # PYTHONDONTWRITEBYTECODE set, an edited module would otherwise be compiled in every run.
    compileall.compile_dir(str(ROOT / "src" / "redline"), quiet=1)
    script = Path(me).parent / "redline"  # the console script users run, else the module
    cli = [str(script), "trace"] if script.exists() else [me, "-m", "redline.cli.main", "trace"]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    print(f"{'':<28} {'command (fresh process, imports included)':^49} {'gunzip':>8}  "
          f"{'analysis (after imports)':^26}")
    print(f"{'trace':<28} {'redline s':>9} {'HTA s':>7} {'faster':>7} {'MB':>6} {'HTA MB':>6} "
          f"{'memory':>6} {'+parse s':>8}  {'redline s':>9} {'HTA s':>7} {'faster':>7}")
    met: list[bool | None] = []
    for label, rel in ({} if args.only_big else CASES).items():
        path = SHARED / rel
        runs: dict[str, list[dict[str, Any]]] = {"rc": [], "hc": [], "ra": [], "ha": [], "b": []}
        for i in range(args.runs):
            order = ["r", "h", "b"] if i % 2 == 0 else ["h", "r", "b"]
            for tag in order:
                if tag == "h" and not have_hta:
                    continue
                if tag == "b":
                    bare = run(me, BARE, path, timeout=600)
                    if bare is not None:
                        runs["b"].append(bare)
                    continue
                if tag == "r":
                    cmd = command([*cli, str(path)], timeout=600)
                    ana = run(me, REDLINE, path, timeout=600)
                else:
                    cmd = command([args.hta_python, "-c", HTA, str(path)], timeout=600)
                    ana = run(args.hta_python, HTA, path, timeout=600)
                if cmd["ok"] or tag == "h":
                    runs[tag + "c"].append(cmd)
                if ana is not None:
                    runs[tag + "a"].append(ana)
        ok_rc = [r for r in runs["rc"] if r["ok"]]
        if not ok_rc or not runs["ra"]:
            met.append(False)
            print(f"{label:<28} redline failed: {runs['rc'][0]['why'] if runs['rc'] else ''}")
            continue
        line, good = _row(label, median_s(ok_rc), max(r["rss_mb"] for r in ok_rc), runs["hc"],
                          median_s(runs["b"]) if runs["b"] else None, median_s(runs["ra"]),
                          median_s(runs["ha"]) if runs["ha"] else None)
        print(line, flush=True)
        met.append(good)
    if args.big:
        met.append(big_trace(args, cli, me, have_hta))
    if not have_hta:
        verdict = "not checked (no HTA)"
    elif all(m is True for m in met):
        verdict = "MET"
    elif any(m is False for m in met):
        verdict = "NOT MET"
    else:
        verdict = "MET where HTA finished (see the rows it did not)"
    print(f"targets (command ≥ {SPEED_TARGET:.0f}× faster end to end, ≤ {MEMORY_TARGET:.0%} of "
          f"HTA's peak memory, on every trace): {verdict}")
    return 0


def big_trace(args: argparse.Namespace, cli: list[str], me: str, have_hta: bool) -> bool | None:
    """The generated ≥ 1 GB trace: one run of each command (HTA capped), and the bare parse."""
    from make_big_trace import make_big_trace

    args.big_dir.mkdir(parents=True, exist_ok=True)
    big = args.big_dir / f"big-{args.big}MB.json"
    try:
        size = make_big_trace(SHARED / CASES["ns_resolution (V100, 15 MB)"], big, args.big)
        label = f"generated {size / 1e9:.2f} GB"
        r = command([*cli, str(big)], timeout=args.big_timeout)
        if not r["ok"]:
            print(f"{label:<28} redline failed: {r['why']}")
            return False
        bare = command([me, "-c", BARE, str(big)], timeout=args.big_timeout,
                       memory_gb=args.memory_gb)
        hta = ([command([args.hta_python, "-c", HTA, str(args.big_dir)],
                        timeout=args.big_timeout, memory_gb=args.memory_gb)]
               if have_hta else [])
        line, good = _row(label, r["s"], r["rss_mb"], hta, bare["s"] if bare["ok"] else None,
                          None, None)
        print(line + ("" if bare["ok"] else f"\n{'':<28} bare parse failed: {bare['why']}"))
        print(f"{'':<28} bare parse peak {bare['rss_mb']:.0f} MB; HTA and the bare parse "
              f"capped at {args.memory_gb:g} GB of address space")
        return good
    finally:
        shutil.rmtree(args.big_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
