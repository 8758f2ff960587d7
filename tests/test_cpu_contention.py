"""cpu_contention wherever it hits: the training thread's own run delay over the window,
with the competing processes named — a CPU-bound child the job started, or an unrelated busy
process beside it — each pinned with the loop to one CPU so that they share it for certain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import redline
from redline.core.findings import Finding
from redline.diagnose import diagnose
from redline.diagnose.thresholds import MAIN_THREAD_RUN_DELAY_MIN_FRACTION, OTHERS_MIN_CORES

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="needs Linux CPU affinity and /proc")

BURN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


@contextmanager
def _pinned() -> Iterator[int]:
    """This process on one CPU, one intra-op thread; both restored after."""
    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cpu = max(cpus)
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)


def _train(seconds: float) -> redline.Watch:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            for _ in range(4):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
    return w


def _contention(w: redline.Watch) -> list[Finding]:
    return [f for f in diagnose(w.report(show=False).measurements) if f.id == "cpu_contention"]


def test_a_cpu_bound_child_of_the_job_on_its_cpu_is_named() -> None:
    with _pinned() as cpu:
        child = subprocess.Popen([sys.executable, "-c", BURN, str(cpu)])
        try:
            time.sleep(0.2)
            w = _train(2.0)
        finally:
            child.kill()
            child.wait()
    m = w.report(show=False).measurements
    delay = m.host.main_thread_run_delay_fraction
    assert delay is not None and delay >= MAIN_THREAD_RUN_DELAY_MIN_FRACTION, delay
    procs = m.host.competing_processes
    assert procs is not None
    mine = [p for p in procs if p.pid == child.pid]
    assert mine and mine[0].child and "-c" in mine[0].command and mine[0].cpu_cores > 0.02
    (f,) = _contention(w)
    assert f"pid {child.pid} " in str(f.evidence["competing_processes"])
    assert f.evidence["main_thread_run_delay_fraction"] == pytest.approx(delay, abs=1e-4)
    assert f.ceiling_speedup == pytest.approx(1 / (1 - delay), abs=1e-3)
    if f.evidence["top_competing_pid"] == child.pid:  # the usual case: it shares the CPU
        assert "child process" in f.fix and str(child.pid) in f.title


def test_an_unrelated_busy_process_on_the_same_cpu_is_named() -> None:
    with _pinned() as cpu:
        # started through a shell that exits at once: re-parented, not a descendant of the job
        out = subprocess.run(["sh", "-c", f"{sys.executable} -c '{BURN}' {cpu} >/dev/null "
                              "2>&1 & echo $!"], capture_output=True, text=True, check=True)
        pid = int(out.stdout.split()[0])
        try:
            time.sleep(0.2)
            w = _train(2.0)
        finally:
            os.kill(pid, signal.SIGKILL)
    m = w.report(show=False).measurements
    procs = m.host.competing_processes
    assert procs is not None
    theirs = [p for p in procs if p.pid == pid]
    assert theirs and not theirs[0].child and theirs[0].cpu_cores > 0.02
    (f,) = _contention(w)
    assert f"pid {pid} " in str(f.evidence["competing_processes"])


def test_a_loop_that_gets_its_cpu_is_not_contended() -> None:
    """Whatever else runs on the host, a training thread that is not kept waiting for a CPU
    draws no cpu_contention: the rule reads the loop's own run delay, not the host's load.
    On a host so loaded that the loop waits anyway (its delay over the threshold, other
    processes on its CPUs), the finding is due, and names none of this test's processes."""
    w = _train(2.0)
    m = w.report(show=False).measurements
    delay = m.host.main_thread_run_delay_fraction
    procs = m.host.competing_processes
    assert delay is not None and procs is not None
    assert not any(p.child for p in procs)
    found = _contention(w)
    busy = sum(p.cpu_cores for p in procs)
    due = delay >= MAIN_THREAD_RUN_DELAY_MIN_FRACTION and busy >= OTHERS_MIN_CORES
    assert bool(found) == due, (delay, busy)


def test_the_training_thread_s_cpu_is_told_apart_from_its_process_s_other_threads() -> None:
    """A thread of the process multiplies matrices (native code, the GIL released) while the
    loop's steps mostly sleep: the process uses the CPU, the training thread next to none."""
    stop = threading.Event()

    def busy() -> None:
        a = torch.randn(256, 256)
        while not stop.is_set():
            a @ a

    other = threading.Thread(target=busy, daemon=True)
    model = nn.Linear(8, 1)
    with _pinned():  # one intra-op thread, so the product runs on the other thread itself
        other.start()
        try:
            with redline.watch(warmup_steps=2, count_flops=False) as w:
                for _ in range(60):
                    time.sleep(0.01)
                    model(torch.randn(4, 8)).sum().backward()
        finally:
            stop.set()
            other.join()
    h = w.report(show=False).measurements.host
    assert h.main_thread_cpu_cores is not None and h.main_cpu_cores is not None
    assert h.main_thread_cpu_cores < 0.1, h  # the loop slept ~10 ms of each ~10.1 ms step
    assert h.main_cpu_cores > h.main_thread_cpu_cores + 0.3, h  # the other thread's share
