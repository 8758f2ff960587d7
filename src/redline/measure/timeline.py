"""Per-step timeline: exclusive phase timing and step-boundary detection.

This module is pure bookkeeping (no torch import): the hooks in :mod:`redline.measure.hooks`
feed it timestamps, and it turns them into :class:`StepRecord` objects. Keeping it pure lets
the step-boundary rules be tested exactly, loop shape by loop shape.

Step definition (docs/report.md, "Definitions"): one optimizer update; where there is no
optimizer, one outermost forward+backward; or whatever the user marks with ``Watch.step()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from redline.measure.step_record import (
    DATA_WAIT,
    EVALUATION,
    FORWARD,
    NO_PHASES,
    OPTIMIZER,
    StepRecord,
    copy_record,
    fresh_record,
    record_minus,
)

_NO_PHASE = -1
_FLOOR = 4
"""Frames at the bottom of the phase stack that never leave it (phase ``_NO_PHASE``): a list
that pop() empties frees its storage and the next append allocates it again (CPython's
``list_resize`` shrinks a list below half its capacity), which is two reallocations per
phase, several per step; above a floor of four frames the stack keeps its storage."""

RECENT_STEPS = 1024
"""Steps the tracker holds in order, every one of them, whatever it keeps for the report
(:attr:`StepTracker.recent`): what live metrics read."""

EVALUATION_SPANS_KEPT = 4096
"""Bridged stretches of evaluation the tracker keeps for the stack sampler
(:attr:`StepTracker.evaluation_spans`), which reads those of a step at its first tick after
the step closed: enough for many fast steps with several validation passes each between two
slowed ticks (~100 kB of tuples)."""

STEP_SOURCES: tuple[str, ...] = ("optimizer", "forward_backward", "manual")


class StepTracker:
    """Turns phase and boundary events into steps.

    Optimizer mode groups several optimizers stepping in one iteration (a GAN's D and G) into one
    step: the set of optimizers that step per iteration (the *cycle*) is learnt when the first
    optimizer steps a second time; that first step is closed retroactively at the previous
    optimizer step, and later steps close as soon as every optimizer of the cycle has stepped.

    Args:
        clock (Callable[[], float]): monotonic clock in seconds.
        on_close (Callable[[StepRecord, bool], None]): called for each closed step with
            ``exact=True`` when it closed at the current instant (not retroactively).
        on_reset (Callable[[], None]): called when steps already closed are withdrawn (the loop
            began marking its own steps with ``Watch.step()``).
        keep (int | None): step records kept at most (None: all). Once a run closes that
            many, every other one is dropped and from then on only steps whose index is a
            multiple of :attr:`stride` (doubled each time) are kept: a uniform sample of the
            run, at a bounded memory, for a job that runs for days. Counts stay exact
            (:attr:`closed`) and :attr:`recent` holds the last steps, every one.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        on_close: Callable[[StepRecord, bool], None] | None = None,
        on_reset: Callable[[], None] | None = None,
        keep: int | None = None,
    ) -> None:
        if keep is not None and keep < 2:
            raise ValueError(f"keep must be >= 2 step records or None, got {keep}")
        self._clock = clock
        self._on_close = on_close
        self._close_callback = on_close
        """``on_close`` as given; :attr:`_on_close` is None while closes are quiet
        (:meth:`close_quietly`)."""
        self._on_reset = on_reset
        self._keep = keep
        self.steps: list[StepRecord] = []
        """The kept step records, in order: every step, or every :attr:`stride`-th one."""
        self.stride = 1
        """Steps each kept record stands for (1 until the run closes ``keep`` steps)."""
        self.closed = 0
        """Steps closed so far, kept or not (the next step's index)."""
        self.recent: deque[StepRecord] = deque(maxlen=RECENT_STEPS)
        """The last :data:`RECENT_STEPS` closed steps, every one."""
        self.source: str | None = None
        """How steps are delimited: one of :data:`STEP_SOURCES`, or None before the first step."""
        self.optimizers_known = False
        """True once any optimizer exists: backward no longer closes steps."""
        self.manual = False
        self._stack: list[list[Any]] = [[_NO_PHASE, 0.0, 0.0] for _ in range(_FLOOR)]
        self.push = self._stack.append
        """``push([phase, t, 0.0])`` is :meth:`enter` without a Python call: the hooks on every
        step's path use it (the stack is the same list for the tracker's life)."""
        self._acc = fresh_record()
        """The step in progress: the record it becomes when it closes, its accumulators
        filled as it runs."""
        self._eval_grad_s = 0.0
        """Of the step in progress's evaluation seconds, those of forwards in eval mode with
        gradients enabled: training after all if a backward follows in this step
        (:meth:`backward_began`)."""
        self._start = clock()
        self._stepped: set[int] = set()
        self._cycle: frozenset[int] | None = None
        self._only: int | None = None
        """The optimizer's id once the cycle is learnt to be that one optimizer (and no step
        is marked by hand): its every step closes a step (on_optimizer_step's fast path)."""
        self._snap: StepRecord | None = None
        self._snap_t = 0.0
        self._snap_eval_grad_s = 0.0
        self._fetch: list[Any] | None = None
        """The last fetch: ``[acc, data-wait s, samples, cpu s, run delay s, read s, loader,
        moved]``, what it added to ``acc`` (the step's accumulators then). The outermost
        forwards before the next fetch say whose batch it was: evaluation's when only
        evaluation forwards follow it (``moved``: its share is in evaluation, not data wait),
        training's as soon as a training forward or a backward does (a teacher run under
        ``no_grad`` before the student's forward leaves the batch training's)."""
        self._gap: list[Any] | None = None
        """After an outermost evaluation forward with no frame around it: ``[acc, end,
        the acc's phase seconds then, whether that forward continued a bridged run]`` (see
        :meth:`bridge_evaluation`); None once training work or another step began."""
        self._bridged = False
        """Whether the evaluation forward in flight (or last ended) was bridged to the one
        before it: its end then extends the same span."""
        self._undo: list[Any] | None = None
        """``[acc, seconds, spans, the last fetch when the last bridged run began]`` bridged
        into the step's evaluation since training work last began: taken back where training
        work begins again with no fetch since that run began (:meth:`fetch_used`)."""
        self._gap_run_fetch: list[Any] | None = None
        """The last fetch when the current run of bridged evaluation forwards began."""
        self.evaluation_spans: deque[tuple[float, float]] = deque(maxlen=EVALUATION_SPANS_KEPT)
        """(start, end) on the tracker's clock of the recent runs of evaluation forwards
        bridged into one: the stack sampler counts its samples there as evaluation, not as
        the lines outside the phases."""
        self._closed: list[tuple[StepRecord, bool]] = []
        self.counts: dict[str, int] = {
            "forward": 0,
            "backward": 0,
            "optimizer_step": 0,
            "batches": 0,
            "manual_step": 0,
            "evaluation": 0,
        }
        """How often each event was seen (for the 'never stepped' message)."""

    # -- phases ---------------------------------------------------------------------------
    def enter(self, phase: int, t: float) -> None:
        # Frames are [phase, start, nested seconds] lists: this runs several times per step
        # and a list is the cheapest mutable record in CPython.
        self._stack.append([phase, t, 0.0])

    def exit(self, phase: int, t: float) -> float:
        """Close the innermost frame of ``phase``; returns its inclusive duration."""
        stack = self._stack
        if stack[-1][0] != phase:
            # A phase can be left open when user code raised inside it (e.g. an optimizer
            # step that failed before its post-hook): drop such stale frames instead of
            # mis-nesting.
            while len(stack) > _FLOOR and stack[-1][0] != phase:
                stack.pop()
            if len(stack) == _FLOOR:
                return 0.0
        _, start, child = stack.pop()
        dur: float = t - start
        self._acc.phases[phase] += dur - child
        stack[-1][2] += dur  # the parent's nested time (a floor frame's is never read)
        return dur

    def exit_eval_grad(self, t: float) -> None:
        """:meth:`exit` of an 'evaluation' frame whose forward ran in eval mode with gradients
        enabled: its exclusive seconds are also held aside, in case a backward follows."""
        acc = self._acc
        before = acc.phases[EVALUATION]
        self.exit(EVALUATION, t)
        self._eval_grad_s += acc.phases[EVALUATION] - before

    def training_forward_began(self) -> None:
        """An outermost forward in training mode with gradients began: the forwards in eval
        mode with gradients before it stay evaluation (this forward is the one the step's
        backward will follow)."""
        self._eval_grad_s = 0.0

    def evaluation_forward_began(self) -> None:
        """An outermost forward of evaluation began: unless a training forward or a backward
        follows before the next fetch (:meth:`fetch_used`), the last fetch fetched an
        evaluation batch, so its wait is evaluation time, not data wait, and its samples are
        not the step's (a validation loader's batches are no training throughput)."""
        fetch = self._fetch
        if fetch is not None and fetch[_F_MOVED] is False and fetch[_F_ACC] is self._acc:
            _move_fetch(fetch, to_evaluation=True)

    def evaluation_forward_ended(self, t: float) -> None:
        """An outermost forward of evaluation (a module in eval mode, gradients disabled) ended
        at ``t``: if another one begins in this step before any training work, the time
        between them is evaluation's too (:meth:`bridge_evaluation`)."""
        if len(self._stack) == _FLOOR:
            acc = self._acc
            # the last fetch when the run of bridged forwards began: a validation pass fetches
            # its batches between them, a teacher's or a rollout's forwards do not
            run_fetch = self._gap_run_fetch if self._bridged else self._fetch
            self._gap_run_fetch = run_fetch
            self._gap = [acc, t, sum(acc.phases), self._bridged]

    def end_evaluation_bridge(self) -> None:
        """Work that is not a validation pass began (an outermost forward with gradients, or
        one under no_grad of a module in training mode, an optimizer step): the time since
        the last evaluation forward is not bridged."""
        self._gap = None

    def bridge_evaluation(self, t: float) -> None:
        """An outermost forward of evaluation (a module in eval mode, gradients disabled)
        begins at ``t``. Where the last outermost forward was one too, in the same step, with
        no other forward, backward, optimizer step or fetch used by training since and no
        frame open around either, the time between them that no phase timed (a validation
        loop's metrics and ``.item()`` calls, a generation's token handling between its
        forwards) is evaluation's, not the loop's own: it is added to the step's evaluation
        and kept as a span for the stack sampler."""
        gap, self._gap = self._gap, None
        self._bridged = False
        acc = self._acc
        if gap is None or gap[0] is not acc or len(self._stack) != _FLOOR:
            return
        between_s = (t - gap[1]) - (sum(acc.phases) - gap[2])
        if between_s <= 0.0:
            return
        acc.phases[EVALUATION] += between_s
        self._bridged = True
        undo = self._undo
        if undo is None or undo[0] is not acc:
            undo = self._undo = [acc, 0.0, 0, None]
        undo[1] += between_s
        undo[3] = self._gap_run_fetch
        spans = self.evaluation_spans
        if gap[3] and spans:
            spans[-1] = (spans[-1][0], t)
        else:
            spans.append((gap[1], t))
            undo[2] += 1

    def frozen_forward_began(self) -> None:
        """An outermost forward of a frozen module began (a teacher, a frozen backbone): the
        last fetch is training's if evaluation had taken it (as :meth:`fetch_used`), but it
        may still be a validation batch's (a linear probe's backbone runs before its head),
        and no bridge of evaluation ends here."""
        fetch = self._fetch
        if fetch is not None and fetch[_F_MOVED] and fetch[_F_ACC] is self._acc:
            _move_fetch(fetch, to_evaluation=False)

    def fetch_used(self) -> None:
        """An outermost forward in training mode or a backward began: the last fetch fed
        training, whatever evaluation forwards ran after it (and no time before it is bridged
        into evaluation). Where no batch was fetched since the last run of bridged evaluation
        forwards began, they worked on this training's batch (a teacher's or a target
        network's outputs, a policy's rollout), not a validation pass (which fetches its
        batches between its forwards): the time bridged between them is the loop's own
        again."""
        self._gap = None
        undo = self._undo
        if undo is not None:
            self._undo = None
            acc = self._acc
            if undo[3] is self._fetch and undo[0] is acc:
                acc.phases[EVALUATION] -= min(undo[1], acc.phases[EVALUATION])
                spans = self.evaluation_spans
                for _ in range(min(undo[2], len(spans))):
                    spans.pop()
        fetch = self._fetch
        if fetch is not None:
            if fetch[_F_MOVED] and fetch[_F_ACC] is self._acc:
                _move_fetch(fetch, to_evaluation=False)
            fetch[_F_MOVED] = None  # training's: an evaluation forward after it leaves it

    def fetch_loader(self, loader: Any) -> None:
        """The last fetch was its iterator's first, from ``loader`` (an object with an
        ``evaluation_iterators`` count, raised while its batch counts as evaluation's)."""
        if self._fetch is not None:
            self._fetch[_F_LOADER] = loader

    def backward_began(self) -> None:
        """An outermost backward began: the step's forwards in eval mode with gradients enabled
        were training forwards (a forward followed by a backward in the same step is training,
        whatever the module's ``training`` flag)."""
        acc = self._acc
        moved = min(self._eval_grad_s, acc.phases[EVALUATION])
        acc.phases[EVALUATION] -= moved
        acc.phases[FORWARD] += moved
        self._eval_grad_s = 0.0
        self.fetch_used()

    def in_phase(self, phase: int) -> bool:
        return any(f[0] == phase for f in self._stack[_FLOOR:])

    def outside_phases(self) -> bool:
        """Whether the training thread is in no timed phase now. Read from the stack sampler's
        thread: a list's length is read atomically under the GIL, and nothing is written."""
        return len(self._stack) == _FLOOR

    def fetched(self, t: float, samples: int | None) -> None:
        """A fetch ended at ``t`` with a batch of ``samples``: :meth:`exit` of its data-wait
        frame and the batch counted, in one call (it runs at every fetch). Kept as the last
        fetch: the forwards after it say whether it was training's (:attr:`_fetch`)."""
        stack = self._stack
        acc = self._acc
        # the fetch's own frame is on top, unless a phase inside the fetch raised and left
        # its frame (exit drops it)
        if stack[-1][0] == DATA_WAIT:
            _, start, child = stack.pop()
            dur = t - start
            wait = dur - child
            acc.phases[DATA_WAIT] += wait
            stack[-1][2] += dur
        else:
            before = acc.phases[DATA_WAIT]
            self.exit(DATA_WAIT, t)
            wait = acc.phases[DATA_WAIT] - before
        acc.batches += 1
        self.counts["batches"] += 1
        if samples is not None:
            acc.samples = (acc.samples or 0) + samples
        self._fetch = [acc, wait, samples, 0.0, 0.0, 0.0, None, False]

    def add_fetch_reading(self, cpu_s: float, run_delay_s: float, wall_s: float) -> None:
        """CPU time and run delay of a fetch that was read, and its wall time (each already
        weighted by the inverse of its sampling rate)."""
        acc = self._acc
        acc.data_cpu_s += cpu_s
        acc.data_run_delay_s += run_delay_s
        acc.data_read_s += wall_s
        fetch = self._fetch
        if fetch is not None and fetch[_F_ACC] is acc:  # the reading of the fetch just made
            fetch[_F_CPU], fetch[_F_DELAY], fetch[_F_READ] = cpu_s, run_delay_s, wall_s

    # -- boundaries -----------------------------------------------------------------------
    def on_backward_end(self, t: float) -> None:
        self.counts["backward"] += 1
        if self.manual or self.optimizers_known:
            return
        self.source = "forward_backward"
        self._close(t, self._acc, exact=True)
        self._new_step()
        self._emit()

    def optimizer_done(self, opt_id: int, t: float) -> None:
        """:meth:`exit` of the optimizer's frame, then :meth:`on_optimizer_step`: the
        optimizer's post-hook, at every step of most jobs, so the exit is inline and so is the
        close of a step by a lone optimizer whose cycle is learnt (the general path gives the
        same record, in a few calls more)."""
        stack = self._stack
        if stack[-1][0] == OPTIMIZER:
            _, start, child = stack.pop()
            dur = t - start
            self._acc.phases[OPTIMIZER] += dur - child
            stack[-1][2] += dur
        else:
            self.exit(OPTIMIZER, t)
        if opt_id != self._only:
            self.on_optimizer_step(opt_id, t)
            return
        self.counts["optimizer_step"] += 1
        # _close and _new_step, inline
        rec = self._acc
        rec.index, rec.start_s, rec.end_s = self.closed, self._start, t
        self._acc = StepRecord(index=-1, start_s=0.0, end_s=0.0, phases=NO_PHASES[:])
        self._eval_grad_s = 0.0
        self._start = t
        self.closed += 1  # _store(rec), inline
        self.recent.append(rec)
        if not rec.index % self.stride:
            self.steps.append(rec)
            if len(self.steps) == self._keep:
                self._thin()
        if self._on_close is not None:
            self._on_close(rec, True)

    def on_optimizer_step(self, opt_id: int, t: float) -> None:
        self.counts["optimizer_step"] += 1
        # training work; and a step closed later at this instant (the snapshot below) must
        # not get the time after it bridged into the next one's evaluation
        self._gap = None
        if opt_id != self._only:
            # Another optimizer (or none learnt yet): optimizer_done's fast path is over.
            self._only = None
        self.optimizers_known = True
        if self.manual:
            return
        self.source = "optimizer"
        if opt_id in self._stepped and self._snap is not None:
            # The cycle repeats: the previous step ended at the previous optimizer step.
            if self._cycle is None:
                self._cycle = frozenset(self._stepped)
                if len(self._cycle) == 1:
                    self._only = opt_id
            rest = record_minus(self._acc, self._snap)
            self._close(self._snap_t, self._snap, exact=False)
            self._acc = rest
            self._eval_grad_s -= self._snap_eval_grad_s
            self._stepped = set()
        self._stepped.add(opt_id)
        if self._cycle is not None and self._stepped >= self._cycle:
            self._close(t, self._acc, exact=True)
            self._new_step()
            self._stepped = set()
            self._snap = None
        else:  # the step may end here: keep what it held at this instant
            self._snap = copy_record(self._acc)
            self._snap_t = t
            self._snap_eval_grad_s = self._eval_grad_s
        if self._closed:
            self._emit()

    def manual_step(self, t: float) -> None:
        self.counts["manual_step"] += 1
        acc = self._acc
        if not self.manual:
            self.manual = True
            self._only = None
            self._stepped = set()
            self._snap = None
            if self.steps:
                # Steps cut automatically before the loop's first own mark were guesses: fold
                # them into this first marked step, and let the owner restart its bookkeeping.
                # (Past ``keep`` of them only a sample is left: each kept record stands for
                # ``stride`` steps.)
                first, w = self.steps[0], self.stride
                for rec in self.steps:
                    for k, v in enumerate(rec.phases):
                        acc.phases[k] += v * w
                    acc.data_cpu_s += rec.data_cpu_s * w
                    acc.data_run_delay_s += rec.data_run_delay_s * w
                    acc.data_read_s += rec.data_read_s * w
                    acc.batches += rec.batches * w
                    if rec.samples is not None:
                        acc.samples = (acc.samples or 0) + rec.samples * w
                self._start = first.start_s
                self.steps.clear()
                self.recent.clear()
                self.closed = 0
                self.stride = 1
                if self._on_reset is not None:
                    self._on_reset()
        self.source = "manual"
        self._close(t, acc, exact=True)
        self._new_step()
        self._emit()

    def close_quietly(self, quiet: bool) -> None:
        """While ``quiet``, steps close without calling ``on_close``: an owner with nothing
        to do at a close but count it reads the count from :attr:`closed` instead (one call
        less on every step's path). ``on_reset`` is still called."""
        self._on_close = None if quiet else self._close_callback

    def restart(self, t: float) -> None:
        """Start the step in progress at ``t``: redline's own work between two steps (stopping
        a profiler, a FLOP counter, taking sampler baselines) is not the next step's time."""
        self._start = t

    def discard(self, t: float) -> None:
        """Drop what the step in progress holds and start it again at ``t``: the time since
        the last step boundary was not training (an evaluation, a checkpoint)."""
        self._new_step()
        del self._stack[_FLOOR:]
        self._gap = self._undo = None
        self._start = t

    def finish(self, t: float) -> None:
        """Close a step still pending at exit (optimizer mode before the cycle was learnt)."""
        if self._snap is not None and self._stepped and not self.manual:
            self._close(self._snap_t, self._snap, exact=False)
            self._snap = None
            self._stepped = set()
        del self._stack[_FLOOR:]
        self._emit()

    def _store(self, rec: StepRecord) -> None:
        self.closed += 1
        self.recent.append(rec)
        if not rec.index % self.stride:
            self.steps.append(rec)
            if len(self.steps) == self._keep:  # never equal while keep is None
                self._thin()

    def _thin(self) -> None:
        """Keep every other record: a uniform sample of twice the stride."""
        self.stride *= 2
        stride = self.stride
        self.steps[:] = [s for s in self.steps if not s.index % stride]

    def _new_step(self) -> None:
        self._acc = fresh_record()
        self._eval_grad_s = 0.0

    def _close(self, t: float, rec: StepRecord, *, exact: bool) -> None:
        """Close ``rec``, the record of the step in progress (or of a snapshot of it), at
        ``t``."""
        rec.index, rec.start_s, rec.end_s = self.closed, self._start, t
        self._start = t
        self._store(rec)
        self._closed.append((rec, exact))

    def _emit(self) -> None:
        """Run the close callbacks once the tracker's state is consistent: a callback may raise
        (e.g. to stop a run after N steps) and must not leave a step half-closed."""
        closed, self._closed = self._closed, []
        if self._on_close is not None:
            for rec, exact in closed:
                self._on_close(rec, exact)


_F_ACC, _F_WAIT, _F_SAMPLES, _F_CPU, _F_DELAY, _F_READ, _F_LOADER, _F_MOVED = range(8)
"""Fields of a fetch record (:attr:`StepTracker._fetch`): a list, made at every fetch.
``moved``: False as fetched, True while counted as evaluation's, None once training used it
(:meth:`StepTracker.fetch_used`: later evaluation forwards do not take it)."""


def _move_fetch(fetch: list[Any], *, to_evaluation: bool) -> None:
    """Move what ``fetch`` added to its step's accumulators from data wait to evaluation, or
    back, and count its iterator's first batch as evaluation's, or no longer."""
    acc: StepRecord = fetch[_F_ACC]
    sign = -1 if to_evaluation else 1
    wait = fetch[_F_WAIT]
    acc.phases[DATA_WAIT] += sign * wait
    acc.phases[EVALUATION] -= sign * wait
    acc.batches += sign
    if fetch[_F_SAMPLES] is not None and acc.samples is not None:
        acc.samples += sign * fetch[_F_SAMPLES]
    acc.data_cpu_s += sign * fetch[_F_CPU]
    acc.data_run_delay_s += sign * fetch[_F_DELAY]
    acc.data_read_s += sign * fetch[_F_READ]
    fetch[_F_MOVED] = to_evaluation
    if fetch[_F_LOADER] is not None:
        fetch[_F_LOADER].evaluation_iterators -= sign
