"""``redline.watch()``: always-on measurement of an unmodified training loop, and its report.

    with redline.watch() as w:
        for batch in loader: ...   # the user's loop, unchanged
    w.report()

The recording is :class:`redline.measure.recorder.Recorder`'s; this adds the report (diagnosis
and rendering), which sits above measurement in the layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redline.core.errors import RedlineError
from redline.core.report import Report
from redline.measure.config import WatchConfig
from redline.measure.ranks import GATHER_TIMEOUT_S
from redline.measure.recorder import Recorder
from redline.report.perfetto import rank_timeline, write_timeline
from redline.report.terminal import print_report
from redline.runs.build import build_report
from redline.runs.metrics_server import MetricsServer
from redline.runs.ranks import exchange


class WatchUsageError(RedlineError, RuntimeError):
    """A watch used out of order (its report asked for before it was entered and left)."""


class Watch(Recorder):
    """Context manager that records a per-step timeline; :meth:`report` after the block."""

    metrics_server: MetricsServer | None = None
    """The live metrics endpoint while the watch runs (``WatchConfig.metrics_port``)."""

    timeline_written: Path | None = None
    """The timeline file :meth:`report` wrote (``WatchConfig.timeline_path``; rank 0 only)."""

    def __enter__(self) -> Watch:
        super().__enter__()
        if self.config.metrics_port is not None:
            server = MetricsServer(self, self.config.metrics_port, self.config.metrics_address)
            try:
                server.start()
            except BaseException as e:
                self.close(e)
                raise
            assert self._stack is not None
            self._stack.callback(server.close)
            self.metrics_server = server
        return self

    def report(self, show: bool = True, command: list[str] | None = None,
               status: str | None = None, status_detail: str | None = None,
               job_stopping: bool = False) -> Report:
        """Build the report (and print it to the terminal when ``show``).

        In a multi-process job (``RANK``/``WORLD_SIZE`` set, as by ``torchrun``) every rank
        calls it: rank 0 gathers the others' summaries through the job's store and returns
        (and prints) the merged report; the other ranks return their own and print nothing.
        ``job_stopping``: the job is being stopped (a signal arrived after the run ended), so
        rank 0 waits for the others as briefly as after a failed run."""
        if not self._entered:
            raise WatchUsageError(
                "report() was called on a watch that was never entered: there is nothing "
                "measured to report. Run the training loop inside it — `with redline.watch() "
                "as w: ...` (or w.__enter__() and w.close()) — then call w.report()")
        if self._stack is not None:
            raise WatchUsageError("report() is available after the `with redline.watch()` "
                                  "block (or w.close()): the watch is still measuring")
        rep = build_report(self, command=command, status=status, status_detail=status_detail)
        others: dict[int, dict[str, Any]] = {}
        if self.rank.distributed:
            # A run that failed or was stopped ends the job: the other ranks are stopped too
            # and report at once or never, so rank 0 does not wait the full gather timeout.
            succeeded = rep.status in ("completed", "step_limit", "no_steps") \
                and not job_stopping
            rep, others = exchange(self, rep, timeout_s=GATHER_TIMEOUT_S if succeeded
                                   else min(GATHER_TIMEOUT_S, 10.0))
        if self.config.timeline_path and self.rank.rank == 0:
            timelines = [rank_timeline(self)] + [
                rank_summary["timeline"] for _, rank_summary in sorted(others.items())
                if rank_summary.get("timeline")]
            try:
                self.timeline_written = write_timeline(self.config.timeline_path, timelines)
            except OSError as e:  # the report stands; the note says what was not written
                rep.measurements.notes.append(f"the timeline was not written: {e}")
        if show and self.rank.rank == 0:
            print_report(rep)
        return rep


_DEFAULTS = WatchConfig()


def watch(
    *,
    warmup_steps: int = _DEFAULTS.warmup_steps,
    max_steps: int | None = _DEFAULTS.max_steps,
    count_flops: bool = _DEFAULTS.count_flops,
    device: str | None = _DEFAULTS.device,
    sample_interval_s: float = _DEFAULTS.sample_interval_s,
    detect_syncs: bool = _DEFAULTS.detect_syncs,
    metrics_port: int | None = _DEFAULTS.metrics_port,
    metrics_address: str = _DEFAULTS.metrics_address,
    timeline_path: str | None = _DEFAULTS.timeline_path,
    steps_kept: int | None = _DEFAULTS.steps_kept,
    stack_sample_interval_s: float | None = _DEFAULTS.stack_sample_interval_s,
) -> Watch:
    """Measure the training loop run inside the ``with`` block. See :class:`WatchConfig` for
    each argument.

    Args:
        warmup_steps: steps at the start recorded but left out of the statistics (default 3).
        max_steps: measured steps (after warm-up) after which the watch's limit is met; None =
            no limit.
        count_flops: count one step's FLOPs with ``torch.utils.flop_counter`` for MFU (that
            step is then left out of the timing statistics).
        device: the device the job trains on ('cuda', 'cuda:1', 'cpu'); None = CUDA if
            available, else CPU.
        sample_interval_s: period of the background CPU / NVML samplers, seconds (> 0).
        detect_syncs: on CUDA, count synchronizing calls (``set_sync_debug_mode('warn')``).
        metrics_port: serve Prometheus metrics on this port (0 = any free port, plus
            ``LOCAL_RANK`` per process); None = no endpoint.
        metrics_address: address the metrics endpoint binds to (default loopback).
        timeline_path: write a Chrome-trace JSON timeline here when the report is built; None =
            no timeline.
        steps_kept: step records kept for the report, at most (>= 1000); None = all.
        stack_sample_interval_s: period of the stack sampler, seconds (0.0005..1; 50 ms in
            warm-up and while under 1 % of the samples are outside the phases); None = no
            stack sampling and no garbage-collection timing.

    Returns:
        A :class:`Watch` context manager; call its ``report()`` after the block.

    Raises:
        WatchConfigError: an argument is out of its range (a ``ValueError`` too; see
            :class:`WatchConfig`).
    """
    return Watch(WatchConfig(
        warmup_steps=warmup_steps, max_steps=max_steps, count_flops=count_flops,
        device=device, sample_interval_s=sample_interval_s, detect_syncs=detect_syncs,
        metrics_port=metrics_port, metrics_address=metrics_address,
        timeline_path=timeline_path, steps_kept=steps_kept,
        stack_sample_interval_s=stack_sample_interval_s,
    ))
