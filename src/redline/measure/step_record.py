"""A training step's record and the phases it times: what :mod:`redline.measure.timeline`
makes of the hooks' timestamps and everything after it reads. No torch, no bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

PHASES: tuple[str, ...] = ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "comm",
                           "evaluation")
"""Timed phases, in the order the systematic path treats them. Time in none of them is 'other'.
'comm' is the host blocked in ``torch.distributed`` collectives the loop calls itself (DDP's and
FSDP's own run inside backward and forward; their waits are read from the flight recorder).
'evaluation' is an outermost forward of a trained model that runs with gradients disabled, or
in eval mode with no backward after it in the same step (docs/report.md, "Definitions"). New
phases are appended: a phase's id is its index, and StepRecord.phases is indexed by it."""

# Phase ids: the hooks pass these ints (a list index is the cheapest accumulator in CPython;
# this code runs several times per training step).
DATA_WAIT, H2D_COPY, FORWARD, BACKWARD, OPTIMIZER, COMM, EVALUATION = range(len(PHASES))

@dataclass(slots=True, kw_only=True)
class StepRecord:
    """One closed step. Times are host wall-clock seconds (``time.perf_counter``).

    The step in progress fills the record it will become (the tracker's accumulators, one
    object a step): its index is -1 and its start and end 0 until it closes."""

    index: int
    """0-based index among all steps the watch closed (warm-up included)."""
    start_s: float
    """Host time the step began (end of the previous step, or watch entry)."""
    end_s: float
    """Host time the step ended (the optimizer step / backward / mark that closed it)."""
    phases: list[float]
    """Exclusive host seconds per phase, indexed like :data:`PHASES`."""
    data_cpu_s: float = 0.0
    """CPU seconds of the training thread inside the data fetches of this step that were read
    (``time.thread_time``: intra-op threads spinning after a matmul are not fetch work),
    weighted by the inverse of their sampling rate (:data:`redline.measure.data_hooks.
    FETCHES_READ_IN_FULL`)."""
    samples: int | None = None
    """Samples in the batches fetched during this step, when the batch size could be read."""
    batches: int = 0
    """Batches fetched during this step."""
    data_run_delay_s: float = 0.0
    """Seconds the training thread was runnable but waiting for a CPU inside the data fetches
    that were read (the scheduler's run delay, /proc/<pid>/task/<tid>/schedstat), weighted
    like ``data_cpu_s``."""
    data_read_s: float = 0.0
    """Wall seconds of the fetches whose CPU time and run delay were read, weighted like them:
    what ``data_cpu_s`` and ``data_run_delay_s`` are fractions of."""
    kind: str = "measured"
    """'warmup', 'measured', or 'excluded' (a step slowed on purpose, e.g. FLOP counting)."""
    device_s: float | None = None
    """Device seconds from the first device work of the step to its end (CUDA events), if known."""
    device_window_s: tuple[float, float] | None = None
    """(first device work, end) of the step on the device's clock (seconds since the watch's
    first CUDA event), if known."""

    @property
    def phase_s(self) -> dict[str, float]:
        """Exclusive host seconds per phase name (nested phases are not double counted)."""
        return dict(zip(PHASES, self.phases, strict=True))

    @property
    def step_s(self) -> float:
        """Wall time of the step (docs/report.md, 'step time')."""
        return self.end_s - self.start_s

    @property
    def other_s(self) -> float:
        """Step time in no timed phase (loss/logging/zero_grad/python overhead)."""
        return max(0.0, self.step_s - sum(self.phases))


NO_PHASES = [0.0] * len(PHASES)
"""A step's phase seconds before anything was timed (copied, never changed)."""


def fresh_record() -> StepRecord:
    """The record of a step that has just begun: its accumulators at zero; its index, start
    and end are set when it closes (:meth:`~redline.measure.timeline.StepTracker._close`)."""
    return StepRecord(index=-1, start_s=0.0, end_s=0.0, phases=NO_PHASES[:])


def copy_record(rec: StepRecord) -> StepRecord:
    """What the step in progress holds now (its accumulators)."""
    return StepRecord(index=-1, start_s=0.0, end_s=0.0, phases=rec.phases[:],
                      data_cpu_s=rec.data_cpu_s, samples=rec.samples, batches=rec.batches,
                      data_run_delay_s=rec.data_run_delay_s, data_read_s=rec.data_read_s)


def record_minus(rec: StepRecord, before: StepRecord) -> StepRecord:
    """What the step in progress gathered since ``before`` (a :func:`copy_record` of it)."""
    samples = None
    if rec.samples is not None:
        samples = rec.samples - (before.samples or 0)
    return StepRecord(index=-1, start_s=0.0, end_s=0.0,
                      phases=[a - b for a, b in zip(rec.phases, before.phases, strict=True)],
                      data_cpu_s=rec.data_cpu_s - before.data_cpu_s, samples=samples,
                      batches=rec.batches - before.batches,
                      data_run_delay_s=rec.data_run_delay_s - before.data_run_delay_s,
                      data_read_s=rec.data_read_s - before.data_read_s)
