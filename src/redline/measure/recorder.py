"""The recorder behind ``redline.watch()``: always-on measurement of an unmodified loop.

    with Recorder(WatchConfig()) as r:
        for batch in loader: ...   # the user's loop, unchanged
    measurements = build_measurements(r)   # redline.measure.summary

:class:`redline.runs.watch.Watch` (what ``redline.watch()`` returns) adds ``report()``. On
entry the recorder installs its hooks (data loaders, root modules, autograd, optimizers,
host→device copies) and samplers (CPU/psutil, CUDA events, NVML); on exit it removes all of
them. Nothing it does synchronizes the device inside the loop.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from types import TracebackType
from typing import Any, TypeVar

import torch

from redline.core.measurements import NvmlSummary
from redline.measure.collectives import Arrival, read_arrivals
from redline.measure.config import WatchConfig
from redline.measure.cpu import CpuSampler, CpuWindow
from redline.measure.cpu_gemm import GemmRates
from redline.measure.cuda import CudaMemory, CudaStepTimer, SyncCounter, read_memory
from redline.measure.ddp import ParallelSnapshot, is_parallel, snapshot
from redline.measure.flops import FlopWindow
from redline.measure.hooks import Instrumentation
from redline.measure.interrupts import KeepInterrupts
from redline.measure.memory import MemorySampler, cuda_reader
from redline.measure.nvml import NvmlSampler, import_pynvml
from redline.measure.profile import TraceCapture
from redline.measure.ranks import ProgressBeacon, rank_info
from redline.measure.stacks import CodeSampler, GcPauses, shorten_switch_interval
from redline.measure.step_record import StepRecord
from redline.measure.timeline import RECENT_STEPS, StepTracker

T = TypeVar("T")
_RECORDERS = itertools.count()
R = TypeVar("R", bound="Recorder")


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); pass device='cpu' or install a CUDA build of torch"
        )
    return dev


class Recorder:
    """Context manager that records a per-step timeline (see :func:`redline.watch`)."""

    def __init__(self, config: WatchConfig | None = None,
                 on_limit: Callable[[], None] | None = None) -> None:
        self.config = config or WatchConfig()
        self.device = resolve_device(self.config.device)
        self._on_limit = on_limit
        self._stack: ExitStack | None = None
        self._state = "warmup"
        self._measured = 0
        self._extras_pending = True
        """Whether FLOP counting or a trace may still be due (see _start_extras)."""
        self._discovered = False
        """The global module hooks have given way (Instrumentation.discovering is over)."""
        self._steady = False
        """Measuring, with the hooks settled and no FLOP count or trace due: a step's close
        only counts it (see _on_close)."""
        self._quiet_from: int | None = None
        """Steady with nothing to do at a close (no CUDA timer, no step limit): the tracker's
        closed count then, from which it closes steps without calling back (every later one
        is measured: :meth:`StepTracker.close_quietly`); None otherwise."""
        self._limit = self.config.max_steps
        self._warmup = 0
        self._excluded = 0
        self._flop_backwards = 0
        """Outermost backwards before the counted step (its passes are the difference)."""
        self._stride = 1
        self.tracker = StepTracker(time.perf_counter, self._on_close, self._on_reset,
                                   keep=self.config.steps_kept)
        self.inst: Instrumentation | None = None
        self.flops = FlopWindow()
        self.capture: TraceCapture | None = None
        self.cpu = CpuSampler(self.config.sample_interval_s)
        self.memory = MemorySampler(lambda: self.tracker.closed)
        """Memory over the run, fed by the CPU sampler's thread (measure/memory.py)."""
        self.cpu.on_sample = self.memory.add
        self.code: CodeSampler | None = None
        """Where the loop's time outside the phases went (None with stack sampling off)."""
        self.gc_pauses: GcPauses | None = None
        self.cuda_timer: CudaStepTimer | None = None
        self.syncs: SyncCounter | None = None
        self.nvml: NvmlSampler | None = None
        self.nvml_reason: str | None = None
        self.nvml_summary: NvmlSummary | None = None
        self.cpu_window: CpuWindow | None = None
        self.cuda_memory: CudaMemory | None = None
        self.torch_threads: int | None = None
        """torch.get_num_threads() when the measured window began (a program may change it
        after its loop, before the report reads it)."""
        self.gemm_rates: GemmRates | None = None
        """This CPU's matrix-product rates, probed once by the first report that needs them
        (measure/cpu_gemm.py): a report built again does not probe again."""
        self.t_enter = 0.0
        self.t_exit: float | None = None
        self.window_start: float | None = None
        self.window_start_ns = 0
        """Wall-clock start of the measured window (the flight recorder's clock)."""
        self.wall_offset_ns = 0
        self.rank = rank_info()
        self.progress_key = f"w{next(_RECORDERS)}"
        """This recorder's keys in the job's store: the n-th recorder of every rank is the same
        one (ranks run the same code)."""
        self._beacon_error: str | None = None
        self._parallel_roots: list[Any] = []
        """The loop's DDP/FSDP2 models, held from the first steps to close: the hooks know
        roots only weakly, and a loop run inside ``main()`` drops them before the report."""
        self.parallel: ParallelSnapshot | None = None
        """What those models said about themselves at close (measure/ddp.py)."""
        self.root_names: list[str] = []
        """The outermost modules' class names, as the steps before the steady state saw them
        (the hooks' own list forgets a root once it is freed)."""
        self.beacon: ProgressBeacon | None = None
        self.arrivals: list[Arrival] = []
        """This rank's arrivals at collectives in the measured window (multi-process jobs)."""
        self.arrivals_reason: str | None = None
        """Why no arrivals were read, if none were."""
        self.exit_error: BaseException | None = None
        self.thread_name: str | None = None
        """The thread that entered the watch: the one measured."""
        self._entered = False

    # -- context ---------------------------------------------------------------------------
    def __enter__(self: R) -> R:
        if self._entered:
            raise RuntimeError("a Watch can be entered once; create a new redline.watch()")
        self._entered = True
        self.thread_name = threading.current_thread().name
        stack = ExitStack()
        try:
            on_work = on_data = None
            if self.device.type == "cuda":
                self.memory = MemorySampler(lambda: self.tracker.closed, cuda_reader(self.device))
                self.cpu.on_sample = self.memory.add
                self.cuda_timer = CudaStepTimer()
                on_work, on_data = self.cuda_timer.work_begins, self.cuda_timer.work_pauses
                if self.config.detect_syncs:
                    self.syncs = stack.enter_context(SyncCounter())
                self._start_nvml(stack)
            self.inst = Instrumentation(self.tracker, self.device.type, on_work,
                                        keep_loaders=self.config.keep_loaders, on_data=on_data)
            self.inst.install(stack)
            self._start_code_sampler(stack)
            # the GC pause timer is a gc callback: a Ctrl-C handled inside it must not be lost
            stack.enter_context(KeepInterrupts())
            self.cpu.start()
            stack.callback(self.cpu.stop)
            self._start_beacon(stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self.t_enter = time.perf_counter()
        self.tracker.restart(self.t_enter)
        if self.config.warmup_steps == 0:
            self._begin_window()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(ev)

    def close(self, error: BaseException | None = None) -> None:
        """Remove every hook and collect the last readings (idempotent)."""
        if self._stack is None:
            return
        stack, self._stack = self._stack, None  # from here on, no step may stop the run
        self.exit_error = error
        t = time.perf_counter()
        self._stop_flops()
        if self.capture is not None and not self.capture.done:
            self.capture.stop()  # the run ended inside the trace: keep what it recorded
        self._state = "closed"  # the samplers' ticks stop counting: the close is no step's
        self.tracker.finish(t)
        self.t_exit = t
        if self.rank.distributed and self.window_start is not None:
            self.arrivals, self.arrivals_reason = read_arrivals(self.window_start_ns,
                                                                time.time_ns())
        if self.cuda_timer is not None:
            self.cuda_timer.drain()
            for rec in self.tracker.steps:
                rec.device_s = self.cuda_timer.device_s.get(rec.index)
                rec.device_window_s = self.cuda_timer.device_window.get(rec.index)
            self.cuda_memory = read_memory(self.device)
        if self.window_start is not None:
            self.cpu_window = self.cpu.window()
            if self.nvml is not None:
                self.nvml_summary = self.nvml.summary()
        self.parallel = snapshot(self._parallel_roots or (self.inst.roots if self.inst else []))
        self._parallel_roots = []  # the user's models are theirs again
        stack.close()
        if self.code is not None:
            self.code.settle()  # its ticks have stopped with the CPU sampler's thread

    def _start_code_sampler(self, stack: ExitStack) -> None:
        """GC timing and the stack sampler, which ticks on the CPU sampler's thread."""
        period = self.config.stack_sample_interval_s
        if period is None:
            return
        def measuring() -> bool:
            return self._state == "measuring"
        self.gc_pauses = GcPauses(self.tracker, measuring)
        self.gc_pauses.install(stack)
        shorten_switch_interval(stack)  # a tick then lands where the loop is (stacks.py)
        self.code = CodeSampler(self.tracker, threading.get_ident(), measuring, self.gc_pauses,
                                period, longest_s=self.config.sample_interval_s)
        self.cpu.set_ticker(self.code.tick, period)

    def _start_beacon(self, stack: ExitStack) -> None:
        """In a multi-process job, publish this rank's progress (see ProgressBeacon)."""
        if not self.rank.distributed:
            return
        try:
            beacon = ProgressBeacon(self.rank, lambda: self.tracker.closed,
                                    self.progress_key)
        except Exception as e:  # no store to reach: the merged report will say so
            self._beacon_error = f"{type(e).__name__}: {e}"
            return
        beacon.start()
        stack.callback(beacon.stop)
        self.beacon = beacon

    def _start_nvml(self, stack: ExitStack) -> None:
        nv, reason = import_pynvml()
        if nv is None:
            self.nvml_reason = reason
            return
        try:
            idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.nvml = NvmlSampler(idx, self.config.sample_interval_s, nv)
        except Exception as e:  # NVML absent in a container, driver mismatch, no permission
            self.nvml_reason = f"NVML init failed: {type(e).__name__}: {e}"
            return
        self.nvml.start()
        stack.callback(self.nvml.stop)

    # -- steps -----------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a step (for loops whose steps redline cannot see)."""
        self.tracker.manual_step(time.perf_counter())

    def skip(self) -> None:
        """Leave the time since the last step end out of every step (call it right after an
        evaluation or a checkpoint that ran between two training steps)."""
        if self.cuda_timer is not None:
            self.cuda_timer.drop_open()
        self.tracker.discard(time.perf_counter())

    def training_loader(self, loader: Any) -> bool:
        """Say which DataLoader trains (the report describes its settings when others, such as
        a validation loader, were iterated too); False when the watch never saw it iterated."""
        return self.inst is not None and self.inst.data.mark_training(loader)

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Time ``next()`` on an iterable that is not a DataLoader as data wait."""
        if self.inst is None:
            raise RuntimeError("wrap() needs an active watch: call it inside `with redline.watch()`")
        return self.inst.wrap(iterable)

    @property
    def steps(self) -> list[StepRecord]:
        return self.tracker.steps

    @property
    def measured_count(self) -> int:
        """Measured steps so far (warm-up and excluded steps left out), without a pass over
        the steps."""
        quiet = self._quiet_from
        if quiet is None:
            return self._measured
        # (a reader on another thread may come between the tracker's reset of its count, at
        # the loop's first own step(), and this recorder's: never below what was counted)
        return self._measured + max(0, self.tracker.closed - quiet)

    @property
    def step_counts(self) -> tuple[int, int, int, int]:
        """Steps closed so far: (all, warm-up, excluded, measured), exact whether or not every
        record is kept (``WatchConfig.steps_kept``)."""
        return self.tracker.closed, self._warmup, self._excluded, self.measured_count

    @property
    def measured_steps(self) -> list[StepRecord]:
        return [s for s in self.tracker.steps if s.kind == "measured"]

    def _begin_window(self, at: float | None = None) -> None:
        """The measured window begins now, or at ``at`` (a step boundary just learnt after the
        fact: the samplers' baselines are still taken now)."""
        now = time.perf_counter()
        self.window_start = now if at is None else at
        self.window_start_ns = time.time_ns() - int((now - self.window_start) * 1e9)
        self.wall_offset_ns = self.window_start_ns - int(self.window_start * 1e9)
        """time.time_ns() − perf_counter in ns: puts step boundaries on the flight recorder's
        clock."""
        self.cpu.mark()
        self.torch_threads = torch.get_num_threads()
        if self.nvml is not None:
            self.nvml.mark()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._state = "measuring"
        if at is None:  # else the step in progress began at the boundary learnt: keep it
            self.tracker.restart(time.perf_counter())

    def _start_extras(self) -> bool:
        """At an exact step boundary: begin the FLOP count or the trace, if one is still due
        (each takes excluded steps); False when none is."""
        if self.config.count_flops and self.flops.flops is None and self.flops.error is None:
            self.flops.start()
            if self.flops.active:
                self._state = "flops"
                # the count ends with the step's first backward and is scaled to its passes
                self._flop_backwards = self.tracker.counts["backward"]
                if self.inst is not None:
                    self.inst.after_backward = self.flops.backward_ended
                return True
        if self.config.trace_dir is not None and self.capture is None:
            self.capture = TraceCapture(self.config.trace_dir, self.device.type,
                                        active=self.config.trace_steps,
                                        host_ops=self.config.trace_host_ops,
                                        rank=self.rank.rank if self.rank.distributed else None)
            if self.capture.start():
                self._state = "tracing"
                return True
        return False

    def _resume(self) -> None:
        """Back to measuring after excluded steps: the window begins now, or, with no warm-up
        (where it began at entry), goes on with the next step."""
        if self.window_start is None:
            self._begin_window()
        else:
            self._state = "measuring"
            self.tracker.restart(time.perf_counter())

    def _on_reset(self) -> None:
        """Closed steps were folded into one (first ``step()`` call): start warm-up again."""
        if self.flops.active:
            self.flops.stop()
            self.flops.flops = None
        if self.cuda_timer is not None:
            self.cuda_timer.reset()
        self._state = "warmup"
        self._steady = False
        if self._quiet_from is not None:
            self._quiet_from = None
            self.tracker.close_quietly(False)
        self._measured = self._warmup = self._excluded = 0
        self._stride = 1
        self._extras_pending = True
        self.window_start = None
        if self.config.warmup_steps == 0:
            self._begin_window()

    def _on_close(self, rec: StepRecord, exact: bool) -> None:
        if self.cuda_timer is not None:
            self.cuda_timer.step_ends(rec.index)
            if self.tracker.stride != self._stride:  # the tracker thinned its records
                self._stride = stride = self.tracker.stride
                recent = rec.index - RECENT_STEPS
                self.cuda_timer.forget(lambda i: i % stride != 0 and i <= recent)
        if self._steady:
            # Measuring, hooks settled, nothing due: what every step of a long job needs.
            self._measured += 1
            if self._limit is not None and self._measured >= self._limit:
                self._stop_at_limit()
            return
        inst = self.inst
        if inst is not None and not self._parallel_roots:
            self._parallel_roots = [m for m in inst.roots if is_parallel(m)]
            self.root_names = inst.root_modules or self.root_names
        if exact and inst is not None and not self._discovered:
            if not inst.discovering:
                self._discovered = True  # the global hooks never come back: stop asking
            elif self._state != "warmup" or rec.index + 1 >= self.config.warmup_steps:
                # A whole step has run: its outermost modules are known, so the per-submodule
                # global hooks (slow path for every module call) give way to hooks on roots.
                inst.switch_to_roots()
        state = self._state
        if state == "warmup":
            rec.kind = "warmup"
            self._warmup += 1
            if exact and rec.index + 1 >= self.config.warmup_steps and not self._start_extras():
                self._begin_window()
            elif not exact and rec.index + 1 >= self.config.warmup_steps:
                # The first step's end is learnt at the second optimizer step, after the fact:
                # the window begins where it ended, so the warm-up is the steps asked for (not
                # one more); the FLOP count and trace, which need a step still to come, begin
                # at the next exact boundary, as with no warm-up.
                self._begin_window(at=rec.end_s)
        elif state == "flops":
            rec.kind = "excluded"
            self._excluded += 1
            self._stop_flops()
            if not self._start_extras():
                self._resume()
        elif state == "tracing":
            rec.kind = "excluded"
            self._excluded += 1
            assert self.capture is not None
            self.capture.step()
            if self.capture.done:
                self._resume()
        else:
            rec.kind = "measured"
            self._measured += 1
            if self._limit is not None and self._measured >= self._limit:
                self._stop_at_limit()
            if exact and self._extras_pending:
                # no warm-up: FLOPs and trace at the first exact boundary; once nothing is due,
                # nothing becomes due (until a reset), and the check leaves the step's path
                self._extras_pending = self._start_extras()
        self._steady = (self._state == "measuring" and self._discovered
                        and not self._extras_pending)
        if self._steady and self.cuda_timer is None and self._limit is None:
            self._quiet_from = self.tracker.closed
            self.tracker.close_quietly(True)

    def _stop_flops(self) -> None:
        """End the FLOP count at the counted step's close: scaled to the backward passes the
        step made (see :class:`~redline.measure.flops.FlopWindow`)."""
        if self.inst is not None:
            self.inst.after_backward = None
        self.flops.stop(self.tracker.counts["backward"] - self._flop_backwards)

    def _stop_at_limit(self) -> None:
        if self._on_limit is None or self._stack is None:
            return
        # Every step end and every fetch from here on calls it again: a step wrapped in a
        # bare ``except:`` cannot swallow the stop for good.
        if self.inst is not None:
            self.inst.data.before_fetch = self._on_limit
        self._on_limit()
