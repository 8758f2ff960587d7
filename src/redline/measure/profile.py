"""A short torch.profiler capture of the running job (``redline doctor --trace``).

Schedule: 1 step waiting, 1 warm-up step (its results are discarded: 'the overhead at the
beginning of profiling is high', PyTorch profiler tutorial), then ``active`` steps recorded.
The steps it covers are slowed by the profiler and are excluded from the step statistics. The
trace is written as Chrome-trace JSON that Perfetto (ui.perfetto.dev) opens, and is analysed by
:mod:`redline.trace`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile, schedule


class TraceCapture:
    """Drives one profiler schedule from step boundaries."""

    def __init__(self, directory: str | os.PathLike[str], device_type: str,
                 active: int = 3, wait: int = 1, warmup: int = 1,
                 host_ops: bool = True, rank: int | None = None) -> None:
        self.dir = Path(directory)
        # one file per rank of a multi-process job, so that the folder holds the job's traces
        self.path = self.dir / (f"redline-trace-rank{rank}.json.gz" if rank is not None
                                else f"redline-trace-{os.getpid()}.json.gz")
        self.cuda = device_type == "cuda"
        self.host_ops = host_ops or not self.cuda  # a CPU run has nothing else to record
        self._steps_total = wait + warmup + active
        self._seen = 0
        self._sched = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        self._prof: Any = None
        self.error: str | None = None
        self.done = False

    def start(self) -> bool:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            acts = (([ProfilerActivity.CPU] if self.host_ops else [])
                    + ([ProfilerActivity.CUDA] if self.cuda else []))
            self._prof = profile(activities=acts, schedule=self._sched,
                                 on_trace_ready=self._export)
            self._prof.start()
            return True
        except Exception as e:  # a profiler already running, no permission for CUPTI, ...
            self.error = f"could not start torch.profiler: {type(e).__name__}: {e}"
            self._prof = None
            self.done = True
            return False

    def _export(self, prof: Any) -> None:
        try:
            prof.export_chrome_trace(str(self.path))
        except Exception as e:  # full disk, unwritable folder
            self.error = f"could not write the trace to {self.path}: {e}"

    def step(self) -> None:
        """Called at each step end; stops the profiler once the schedule has run."""
        if self._prof is None or self.done:
            return
        self._seen += 1
        try:
            self._prof.step()
            if self._seen >= self._steps_total:
                self.stop()
        except Exception as e:
            self.error = f"torch.profiler failed: {type(e).__name__}: {e}"
            self.stop()

    def stop(self) -> None:
        prof, self._prof = self._prof, None
        self.done = True
        if prof is not None:
            try:
                prof.stop()
            except Exception as e:
                self.error = self.error or f"torch.profiler failed to stop: {e}"

    @property
    def steps_needed(self) -> int:
        return self._steps_total

    @property
    def written(self) -> bool:
        return self.path.exists() and self.error is None

