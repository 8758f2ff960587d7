"""Diagnosis benchmark: does a tool name the one injected cause of an ordinary training job?

Jobs: ``benchmarks/diagnosis_jobs/*.py``, one ordinary training script each (an MLP, a small
CNN, a GRU/LSTM, a tiny transformer; a DataLoader or not; 1 or 2 ranks), each with one dominant
injected cause, plus clean controls. The answer key, ``benchmarks/diagnosis_key.py``, was
committed before the first run: per job its cause class, the redline finding ids that name it,
the rank it concerns for DDP jobs, and the findings that are true but not specific (tolerated).

Each job runs under each tool the way that tool's README tells a user:
- redline: ``redline doctor --json OUT -- python JOB`` (2 ranks: ``redline doctor --json OUT --
  torchrun --nproc-per-node 2 JOB``, the launch docs/distributed.md gives); no code change.
- traceml-ai: ``traceml run [--nproc-per-node 2] JOB`` with ``traceml.init(mode="auto")`` and the
  step body under ``with traceml.trace_step(model):`` (``DIAG_PEER=traceml`` turns those lines on
  in ``diagnosis_jobs/_peer.py``); its verdicts are read from ``logs/<run>/final_summary.json``:
  the primary diagnosis first, then every section's issues.
- gpuprof: ``with gpuprof.profile(name):`` around the loop (``DIAG_PEER=gpuprof``), run as
  ``python JOB`` (or ``torchrun --nproc-per-node 2 JOB``), then ``gpuprof insights --json
  gpuprof.db`` (2 ranks: ``--group`` for the job, then each rank's run), in its order.
Each peer lives in its own venv under ``benchmarks/.peers/<tool>`` (git-ignored), made by
``--setup-peers`` with the CPU torch 2.13.0 that lies on this machine's disk.

Definitions (the same for every tool):
- *detected*: an accepted entry is among the tool's findings (for a key with a rank, one that
  names that rank). For redline an accepted entry is one of the key's ``accepted_ids``; for a
  peer, a label whose class (the mapping below) is the job's cause class.
- *ranked first*: the tool's first finding (redline's report order; traceml's primary
  diagnosis; gpuprof's first insight) is accepted.
- *false alarm*: a finding of severity high or medium that is neither accepted nor tolerated
  for the job; on a control, any high/medium finding (a peer's "compute-bound" verdict, which
  is right for a control, excepted). Severity: traceml crit/warn/info = high/medium/low;
  gpuprof's own high/medium/low. Entries that say nothing was found (traceml's neutral states
  NORMAL, BALANCED, NO_DATA, WARMUP, NO_GPU and its INSUFFICIENT_* abstentions; gpuprof
  "No major bottlenecks detected", "No rank skew detected") are not findings.

Peer labels -> cause classes (from their docs and rule code, not from results):
- traceml: INPUT_BOUND -> data, storage; RESIDUAL_HEAVY (time in the step outside its phases)
  -> host_work only (it names no kind); STRAGGLER / INPUT_STRAGGLER / COMPUTE_STRAGGLER /
  H2D_STRAGGLER -> straggler (with the ranks it lists); HIGH_CPU ("CPU-side preprocessing or
  host contention") -> contention, data; COMPUTE_BOUND -> control; others (H2D_BOUND, memory,
  GPU utilisation) -> no class.
- gpuprof: "waiting on the loader", "Prefetch queue starved" -> data, storage; "Dataloader
  stall + CPU pegged", "Dataloader-worker imbalance" -> data; "Dataloader stall + disk hot",
  "Cold-cache pattern", "Cache thrashing" -> storage, data; "unaccounted (kernel-launch /
  Python overhead)" -> host_work; "Low arithmetic intensity" -> small_batch; "Rank skew: rank N"
  and "Bucket b: rank N is late" -> straggler naming rank N; "high tail latency" -> periodic;
  the rest (MFU, memory, cost, regression, thermals, PCIe, first-step, kernel drift, comm
  share) -> no class.

Run:
    .venv/bin/python benchmarks/diagnosis.py --setup-peers          # once: the peers' venvs
    .venv/bin/python benchmarks/diagnosis.py [--jobs a,b] [--tools redline,traceml,gpuprof]
        [--repeat N] [--timeout 300] [--json PATH]
    .venv/bin/python benchmarks/diagnosis.py --table-from a.json b.json   # runs done in parts
Prints one row per job (detected / ranked first / false alarms per tool) and the totals. Each
run has a timeout; a tool that fails on a job gets "error" in its cell (the reason in the
JSON); every process the harness started is killed when it ends, however it ends.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnosis_key import BY_SCRIPT, KEY, JobKey

ROOT = Path(__file__).resolve().parent.parent
JOBS_DIR = ROOT / "benchmarks" / "diagnosis_jobs"
PEERS_DIR = ROOT / "benchmarks" / ".peers"
REDLINE_BIN = ROOT / ".venv" / "bin"
TOOLS: tuple[str, ...] = ("redline", "traceml", "gpuprof")
PEER_PACKAGES: dict[str, tuple[str, ...]] = {"traceml": ("traceml-ai",), "gpuprof": ("gpuprof", "numpy")}
SEVERE = ("high", "medium")


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One entry of a tool's diagnosis, in a common shape."""

    id: str
    """redline's finding id; a peer's label (traceml kind, gpuprof rule name)."""
    severity: str
    """high, medium or low."""
    classes: tuple[str, ...] = ()
    """Cause classes a peer's label names (empty for redline: its ids are matched directly)."""
    rank: int | None = None
    """The rank the finding names, where it names one."""
    title: str = ""
    """The tool's own words."""


@dataclass(kw_only=True)
class Score:
    """A tool's findings on one job, judged against the key."""

    detected: bool
    """An accepted finding is among the findings."""
    first: bool
    """The first finding is accepted."""
    false_alarms: list[str] = field(default_factory=list)
    """Ids of high/medium findings neither accepted nor tolerated."""


def _accepted(key: JobKey, f: Finding, tool: str) -> bool:
    if key.cause_class == "control":
        return False
    hit = f.id in key.accepted_ids if tool == "redline" else key.cause_class in f.classes
    return hit and (key.rank is None or f.rank == key.rank)


def _tolerated(key: JobKey, f: Finding, tool: str) -> bool:
    if tool == "redline":
        return f.id in key.tolerated_ids
    if key.cause_class == "control":
        return "control" in f.classes
    return bool(set(f.classes) & set(key.tolerated_classes))


def score(key: JobKey, findings: Sequence[Finding], tool: str) -> Score:
    """Detected / ranked first / false alarms of ``findings`` (in the tool's order) for ``key``."""
    accepted = [_accepted(key, f, tool) for f in findings]
    false = [f.id for f, ok in zip(findings, accepted, strict=True)
             if not ok and f.severity in SEVERE and not _tolerated(key, f, tool)]
    return Score(detected=any(accepted), first=bool(accepted) and accepted[0], false_alarms=false)


# ---------------------------------------------------------------------------------------------
# Reading each tool's output

def redline_findings(report: dict[str, Any]) -> list[Finding]:
    """The findings of a redline JSON report (schema redline.report/2), in report order."""
    return [Finding(id=f["id"], severity=f["severity"], rank=f.get("rank"), title=f.get("title", ""))
            for f in report.get("findings", [])]


TRACEML_CLASSES: dict[str, tuple[str, ...]] = {
    "INPUT_BOUND": ("data", "storage"), "RESIDUAL_HEAVY": ("host_work",),
    "STRAGGLER": ("straggler",), "INPUT_STRAGGLER": ("straggler",),
    "COMPUTE_STRAGGLER": ("straggler",), "H2D_STRAGGLER": ("straggler",),
    "HIGH_CPU": ("contention", "data"), "COMPUTE_BOUND": ("control",),
}
# its neutral states (traceml_ai/diagnostics/common.py) and its abstentions
TRACEML_NOT_FINDINGS = ("NORMAL", "NO_GPU", "NO_DATA", "WARMUP", "OK", "BALANCED", "INSUFFICIENT",
                        "INCOMPLETE")
TRACEML_SEVERITY = {"crit": "high", "critical": "high", "warn": "medium", "warning": "medium"}


def _traceml_entry(d: dict[str, Any]) -> Finding | None:
    kind = str(d.get("kind", ""))
    if not kind or kind.startswith(TRACEML_NOT_FINDINGS):
        return None
    ranks = [r for r in d.get("ranks") or [] if isinstance(r, int)]
    return Finding(id=kind, severity=TRACEML_SEVERITY.get(str(d.get("severity", "")).lower(), "low"),
                   classes=TRACEML_CLASSES.get(kind, ()), rank=ranks[0] if len(ranks) == 1 else None,
                   title=str(d.get("summary", "")))


def traceml_findings(summary: dict[str, Any]) -> list[Finding]:
    """traceml's final_summary.json: the primary diagnosis, then each section's issues."""
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    entries: list[dict[str, Any]] = []
    if isinstance(summary.get("primary_diagnosis"), dict):
        entries.append(summary["primary_diagnosis"])
    for section in ("step_time", "system", "process", "step_memory"):
        sec = summary.get(section)
        if isinstance(sec, dict):
            entries.extend(i for i in sec.get("issues") or [] if isinstance(i, dict))
    for d in entries:
        f = _traceml_entry(d)
        if f is not None and (f.id, f.title) not in seen:
            seen.add((f.id, f.title))
            out.append(f)
    return out


GPUPROF_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (pattern in the title, rule name, classes); first match wins
    (r"Dataloader stall \+ CPU pegged", "cpu_bound_dataloader", ("data",)),
    (r"Dataloader stall \+ disk hot", "io_bound_dataloader", ("storage", "data")),
    (r"waiting on the loader", "dataloader_stall", ("data", "storage")),
    (r"Prefetch queue starved", "prefetch_queue_starved", ("data", "storage")),
    (r"Dataloader-worker imbalance", "worker_imbalance", ("data",)),
    (r"Cold-cache pattern", "cold_cache", ("storage", "data")),
    (r"Cache thrashing", "cache_thrashing", ("storage", "data")),
    (r"unaccounted", "kernel_launch_overhead", ("host_work",)),
    (r"Low arithmetic intensity", "small_batch", ("small_batch",)),
    (r"^Rank skew", "rank_skew", ("straggler",)),
    (r"^Bucket \d+: rank", "bucket_skew", ("straggler",)),
    (r"high tail latency", "high_step_variance", ("periodic",)),
    (r"^MFU", "low_mfu", ()), (r"^Peak memory", "memory_pressure", ()),
    (r"warmup / JIT compile", "compilation_warmup", ()), (r"^Step 0 =", "first_step_outlier", ()),
    (r"backward/forward", "gradient_checkpointing", ()), (r"unfused", "sdpa_suboptimal", ()),
    (r"thermal", "thermal_throttling", ()), (r"PCIe", "pcie_saturation", ()),
    (r"^Regression", "regression", ()), (r"^Estimated cost", "cost_projection", ()),
    (r"^Kernel drift", "kernel_drift", ()), (r"Host memory pressure", "host_memory_pressure", ()),
    (r"comm is", "comm_dominant", ()),
)
GPUPROF_NOT_FINDINGS = ("No major bottlenecks detected", "No rank skew detected")


def gpuprof_findings(insights: Sequence[dict[str, Any]], rank: int | None = None) -> list[Finding]:
    """gpuprof's insights (``gpuprof insights --json``'s ``insights``), in its order."""
    out: list[Finding] = []
    for it in insights:
        title = str(it.get("title", ""))
        if title.startswith(GPUPROF_NOT_FINDINGS):
            continue
        name = "unknown"
        classes: tuple[str, ...] = ()
        for pattern, rule, cls in GPUPROF_RULES:
            if re.search(pattern, title):
                name, classes = rule, cls
                break
        named = rank
        if name in ("rank_skew", "bucket_skew"):
            m = re.search(r"rank (\d+)", title)
            named = int(m.group(1)) if m else None
        out.append(Finding(id=name, severity=str(it.get("severity", "low")), classes=classes,
                           rank=named, title=title))
    return out


# ---------------------------------------------------------------------------------------------
# Processes: every one the harness starts is in its own session and killed at the end

_STARTED: list[subprocess.Popen[bytes]] = []


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)
        if sig == signal.SIGTERM:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=3)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=3)


def _kill_all() -> None:
    while _STARTED:
        _kill_group(_STARTED.pop())


def _on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def start(cmd: Sequence[str], *, cwd: Path, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session (so its whole tree can be killed), output to ``out``."""
    with open(out, "ab") as log:
        p = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    _STARTED.append(p)
    return p


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def _kill_procs(procs: Sequence[psutil.Process]) -> None:
    """Kill processes a run started in sessions of their own (traceml's aggregator, torchrun's)."""
    for q in procs:
        with contextlib.suppress(psutil.Error):
            q.kill()  # psutil checks the pid still names the process it saw (creation time)
    psutil.wait_procs(list(procs), timeout=3)


def run(cmd: Sequence[str], *, cwd: Path, env: dict[str, str], out: Path, timeout_s: float) -> int | None:
    """Run ``cmd`` to its end (None on timeout); whatever it left running is killed."""
    with open(out, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
    p = start(cmd, cwd=cwd, env=env, out=out)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + timeout_s
    rc: int | None = None
    while True:
        # every descendant seen while the run lasts, so that one that left the session (a tool
        # may start its helpers with setsid) or lost its parent is still known at the end
        seen.update((q.pid, q) for q in _descendants(p.pid))
        with contextlib.suppress(subprocess.TimeoutExpired):
            rc = p.wait(timeout=0.5)
            break
        if time.monotonic() > deadline:
            rc = None
            break
    _kill_group(p)  # the job's own leftovers (daemon children) too
    _kill_procs(list(seen.values()))
    _STARTED.remove(p)
    return rc


@contextlib.contextmanager
def busy_neighbour(enabled: bool, cwd: Path) -> Iterator[None]:
    """One CPU-bound process per CPU beside the job, unrelated to it, for the job's whole run."""
    procs = [start([sys.executable, "-c", "while True: pass"], cwd=cwd, env=dict(os.environ),
                   out=cwd / "busy.log") for _ in range((os.cpu_count() or 1) if enabled else 0)]
    try:
        yield
    finally:
        for p in procs:
            _kill_group(p)
            _STARTED.remove(p)


def _env(tool: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DIAG_PEER", "VIRTUAL_ENV", "PYTHONPATH")}
    bindir = REDLINE_BIN if tool == "redline" else PEERS_DIR / tool / "bin"
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    if tool != "redline":
        env["DIAG_PEER"] = tool
    return env


def _tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# One job under one tool

def run_tool(tool: str, key: JobKey, wd: Path, timeout_s: float) -> dict[str, Any]:
    """Run one job under one tool in the fresh folder ``wd``; the result as a JSON-able dict."""
    job = str(JOBS_DIR / key.script)
    name = key.script.removesuffix(".py")
    env = _env(tool)
    log = wd / f"{tool}.log"
    launch = ["python", job] if key.nproc == 1 else ["torchrun", f"--nproc-per-node={key.nproc}", job]
    t0 = time.monotonic()
    result: dict[str, Any] = {"status": "error", "reason": "", "findings": [], "log": str(log)}
    if tool != "redline" and not (PEERS_DIR / tool / "bin" / "python").exists():
        result.update(status="n/a", reason=f"{tool} is not installed: run with --setup-peers")
        return result
    with busy_neighbour(key.busy_neighbour, wd):
        if tool == "redline":
            out = wd / "redline.json"
            rc = run([str(REDLINE_BIN / "redline"), "doctor", "--json", str(out), "--", *launch],
                     cwd=wd, env=env, out=log, timeout_s=timeout_s)
            findings, reason = _read(out, lambda d: redline_findings(d), rc, log)
        elif tool == "traceml":
            cmd = [str(PEERS_DIR / "traceml" / "bin" / "traceml"), "run", "--logs-dir", str(wd / "logs"),
                   "--run-name", name]
            if key.nproc > 1:
                cmd += ["--nproc-per-node", str(key.nproc)]
            rc = run([*cmd, job], cwd=wd, env=env, out=log, timeout_s=timeout_s)
            findings, reason = _read(wd / "logs" / name / "final_summary.json", traceml_findings, rc, log)
        else:
            rc = run(launch, cwd=wd, env=env, out=log, timeout_s=timeout_s)
            findings, reason = _gpuprof(wd, env, log, rc, timeout_s)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["rc"] = rc
    result["timed_out"] = rc is None
    # other sessions' load on a shared host: a reader can tell a contention finding's cause
    result["host_loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if findings is None:
        result["reason"] = reason
        return result
    result.update(status="ok", findings=[asdict(f) for f in findings])
    result["score"] = asdict(score(key, findings, tool))
    return result


def _read(path: Path, parse: Any, rc: int | None, log: Path) -> tuple[list[Finding] | None, str]:
    why = "timed out" if rc is None else f"exit code {rc}"
    if not path.exists():
        return None, f"{why}; no {path.name} written; log tail: {_tail(log)}"
    try:
        return parse(json.loads(path.read_text())), ""
    except (ValueError, KeyError, TypeError) as e:
        return None, f"{why}; {path.name} unreadable ({e})"


def _gpuprof(wd: Path, env: dict[str, str], log: Path, rc: int | None,
             timeout_s: float) -> tuple[list[Finding] | None, str]:
    db = wd / "gpuprof.db"
    if not db.exists():
        why = "timed out" if rc is None else f"exit code {rc}"
        return None, f"{why}; no gpuprof.db; log tail: {_tail(log)}"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        runs = conn.execute("SELECT id, rank, group_id FROM runs ORDER BY rank, id").fetchall()
    if not runs:
        return None, "gpuprof.db holds no run"
    gp = str(PEERS_DIR / "gpuprof" / "bin" / "gpuprof")
    findings: list[Finding] = []
    # several ranks: the group's analysis (rank skew) first, then each rank's own run
    queries: list[tuple[list[str], int | None]] = []
    groups = sorted({g for _, _, g in runs if g} if len(runs) > 1 else set())
    queries += [(["--group", g, str(db)], None) for g in groups]
    queries += [([str(db), str(run_id)], rank if len(runs) > 1 else None) for run_id, rank, _ in runs]
    for args, rank in queries:
        out = wd / "gpuprof_insights.json"
        with open(out, "wb") as fh:
            p = subprocess.run([gp, "insights", "--json", *args], cwd=wd, env=env, stdout=fh,
                               stderr=subprocess.PIPE, timeout=timeout_s, check=False)
        if p.returncode != 0:
            return None, f"gpuprof insights {' '.join(args)}: exit {p.returncode}: {p.stderr.decode()[-400:]}"
        findings += gpuprof_findings(json.loads(out.read_text()).get("insights", []), rank)
    return findings, ""


# ---------------------------------------------------------------------------------------------
# The table

def _cell(results: list[dict[str, Any]], what: str) -> str:
    ok = [r for r in results if r["status"] == "ok"]
    if not ok:
        r = results[0]
        if r["status"] == "error":
            return "error: timed out" if r.get("timed_out") else "error"
        return f"n/a: {r['reason']}"
    if what == "fa":
        ids = sorted({i for r in ok for i in r["score"]["false_alarms"]})
        n = sum(len(r["score"]["false_alarms"]) for r in ok)
        return f"{n}" + (f" ({', '.join(ids)})" if ids else "")
    hits = sum(bool(r["score"][what]) for r in ok)
    cut = " (timed out)" if any(r.get("timed_out") for r in ok) else ""
    if len(results) == 1:
        return ("y" if hits else "n") + cut
    return f"{hits}/{len(results)}{cut}"


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.0f} %)" if n else "-"


def table(results: dict[str, dict[str, list[dict[str, Any]]]], tools: Sequence[str]) -> str:
    """One markdown row per job, then totals, for ``results[job][tool] = [run, ...]``."""
    head = ["job", "class"]
    for t in tools:
        head += [f"{t} detected", f"{t} first", f"{t} false alarms"]
    rows = [head, ["---"] * len(head)]
    for job, by_tool in results.items():
        key = BY_SCRIPT[job]
        row = [job, key.cause_class]
        for t in tools:
            rs = by_tool[t]
            if key.cause_class == "control":
                row += ["-", "-", _cell(rs, "fa")]
            else:
                row += [_cell(rs, "detected"), _cell(rs, "first"), _cell(rs, "fa")]
        rows.append(row)
    causes = [j for j in results if BY_SCRIPT[j].cause_class != "control"]
    controls = [j for j in results if BY_SCRIPT[j].cause_class == "control"]
    total = ["total", f"{len(causes)} causes, {len(controls)} controls"]
    for t in tools:
        runs = [r for j in causes for r in results[j][t]]
        det = sum(r["status"] == "ok" and r["score"]["detected"] for r in runs)
        first = sum(r["status"] == "ok" and r["score"]["first"] for r in runs)
        errs = sum(r["status"] != "ok" for j in results for r in results[j][t])
        fa = sum(len(r["score"]["false_alarms"]) for j in results for r in results[j][t]
                 if r["status"] == "ok")
        fa_ctl = sum(any(r["status"] == "ok" and r["score"]["false_alarms"] for r in results[j][t])
                     for j in controls)
        total += [_pct(det, len(runs)) + (f", {errs} not run" if errs else ""), _pct(first, len(runs)),
                  f"{fa} ({fa_ctl}/{len(controls)} controls)"]
    rows.append(total)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
                     for r in rows)


# ---------------------------------------------------------------------------------------------

def setup_peers(tools: Sequence[str]) -> None:
    """A venv per peer under benchmarks/.peers/<tool> with the CPU torch 2.13.0 and the peer."""
    for tool in tools:
        if tool == "redline":
            continue
        venv = PEERS_DIR / tool
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # torch pinned: 2.13.0 lies on this machine's disk; pip must never replace it
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0",
                        *PEER_PACKAGES[tool]], check=True)
        print(f"{tool}: installed in {venv}")


def table_from(paths: Sequence[Path]) -> str:
    """The table of the jobs that every tool finished in earlier runs' --json files."""
    merged: dict[str, dict[str, list[dict[str, Any]]]] = {}
    tools: list[str] = []
    for path in paths:
        data = json.loads(path.read_text())
        tools = tools or list(data["tools"])
        for job, by_tool in data["results"].items():
            if all(by_tool.get(t) for t in tools):
                merged[job] = by_tool
    order = [k.script.removesuffix(".py") for k in KEY]
    return table({j: merged[j] for j in order if j in merged}, tools)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", help="comma-separated job names (default: all)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of " + ", ".join(TOOLS))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each job under each tool")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    ap.add_argument("--json", type=Path, help="write every raw result here")
    ap.add_argument("--keep", type=Path, help="keep each run's folder (logs, reports) under this one")
    ap.add_argument("--setup-peers", action="store_true", help="make the peers' venvs, then stop")
    ap.add_argument("--table-from", type=Path, nargs="+", metavar="JSON",
                    help="print the table of earlier runs' --json files (jobs merged, later files win)")
    args = ap.parse_args(argv)
    if args.table_from:
        print(table_from(args.table_from))
        return 0
    tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        ap.error(f"unknown tools {unknown}; expected some of {', '.join(TOOLS)}")
    if args.setup_peers:
        setup_peers(tools)
        return 0
    jobs = args.jobs.split(",") if args.jobs else [k.script.removesuffix(".py") for k in KEY]
    missing = [j for j in jobs if j not in BY_SCRIPT]
    if missing:
        ap.error(f"unknown jobs {missing}; expected some of {', '.join(BY_SCRIPT)}")
    atexit.register(_kill_all)
    signal.signal(signal.SIGTERM, _on_signal)
    base = args.keep or Path(tempfile.mkdtemp(prefix="diagnosis-"))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for job in jobs:
            results[job] = {t: [] for t in tools}
            for rep in range(args.repeat):
                for tool in tools:
                    wd = base / f"{job}.{tool}.{rep}"
                    shutil.rmtree(wd, ignore_errors=True)
                    wd.mkdir(parents=True)
                    try:
                        r = run_tool(tool, BY_SCRIPT[job], wd, args.timeout)
                    except Exception as e:  # one tool failing on one job never stops the run
                        r = {"status": "error", "reason": f"{type(e).__name__}: {e}", "findings": []}
                    results[job][tool].append(r)
                    s = r.get("score") or {}
                    print(f"[{job} {tool} #{rep}] {r['status']} {r.get('wall_s', '')} s "
                          f"detected={s.get('detected')} first={s.get('first')} "
                          f"false={s.get('false_alarms')} ids={[f['id'] for f in r['findings']]}"
                          + (f" reason={r['reason'][:200]!r}" if r["status"] != "ok" else ""), flush=True)
            if args.json:
                args.json.write_text(json.dumps({"tools": tools, "results": results}, indent=1))
    finally:
        _kill_all()
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
        # an interrupted run still prints the jobs every tool finished
        done = {j: r for j, r in results.items() if all(len(r[t]) == args.repeat for t in tools)}
        print()
        print(table(done, tools), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"tools": tools, "results": results,
                                         "key": {j: asdict(BY_SCRIPT[j]) for j in results}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
