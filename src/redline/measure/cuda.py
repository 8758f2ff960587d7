"""CUDA-side measurement that adds no synchronization to the training loop.

* Device time per step from CUDA events: one event at the step's first device work (root
  forward or first host→device copy), one at its end. Events are polled with ``query()`` (never
  ``synchronize()``) at later step ends; only at watch exit are the last ones waited for.
  The span between the two events is an upper bound of the device's busy time in that step: it
  includes idle gaps inside the step (launch-bound stretches, host syncs), but not the time the
  device waits between steps (data loading). Exact busy time needs a trace (docs/report.md).
* Synchronizing calls counted with ``torch.cuda.set_sync_debug_mode('warn')``: process-global,
  set on entry and restored on exit; experimental upstream (``torch.cuda.set_sync_debug_mode``
  docs: "may not catch all synchronizing operations"), so counts are a lower bound.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import torch


class EventLike(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...


def _cuda_event() -> EventLike:
    ev: EventLike = torch.cuda.Event(enable_timing=True)
    return ev


class CudaStepTimer:
    """Brackets each step's device work with events and resolves them lazily.

    A step's device time is the sum of its *work segments*: a segment opens at the first
    device work (root forward, H2D copy) and closes when the host goes back to the data
    loader or the step ends. With gradient accumulation the host fetches a batch between
    micro-batches; a single first-work → step-end span would count the device idling through
    those fetches as busy (a data-starved step would read a high span while it mostly
    waited). Events run in stream order, so segments never overlap
    and their sum is at most the step's wall time; gaps *inside* a segment (launch overhead)
    still count, so it stays an upper bound of busy time.

    Args:
        event_factory: makes an event; CUDA events by default (injectable for tests).
    """

    def __init__(self, event_factory: Callable[[], EventLike] = _cuda_event) -> None:
        self._new = event_factory
        self._start: EventLike | None = None
        self._segments: list[tuple[EventLike, EventLike]] = []
        self._pending: deque[tuple[int, list[tuple[EventLike, EventLike]]]] = deque()
        self.device_s: dict[int, float] = {}
        """Step index → device seconds (Σ over the step's work segments), once resolved."""
        self._origin: EventLike | None = None
        self.device_window: dict[int, tuple[float, float]] = {}
        """Step index → (first work, end) in device seconds since the timer's first event.
        A device-bound loop's host runs ahead of the device, so its host step times are not
        the device's: the span fraction needs the device's own clock (see measure/stats.py)."""

    def work_begins(self) -> None:
        """Called at each forward/copy; opens a segment unless one is open."""
        if self._start is None:
            ev = self._new()
            ev.record()
            self._start = ev
            if self._origin is None:
                self._origin = ev

    def work_pauses(self) -> None:
        """Called when the host starts waiting for data; closes the open segment, if any."""
        if self._start is not None:
            end = self._new()
            end.record()
            self._segments.append((self._start, end))
            self._start = None

    def step_ends(self, index: int) -> None:
        self.work_pauses()
        if self._segments:
            self._pending.append((index, self._segments))
            self._segments = []
        self.poll()

    def _resolve(self, idx: int, segments: list[tuple[EventLike, EventLike]]) -> None:
        self.device_s[idx] = sum(s.elapsed_time(e) for s, e in segments) / 1e3
        if self._origin is not None:
            self.device_window[idx] = (self._origin.elapsed_time(segments[0][0]) / 1e3,
                                       self._origin.elapsed_time(segments[-1][1]) / 1e3)

    def forget(self, drop: Callable[[int], bool]) -> None:
        """Drop the resolved times of the steps ``drop`` names (records the watch no longer
        keeps), so a long job's timer stays bounded."""
        for d in (self.device_s, self.device_window):
            for i in [i for i in d if drop(i)]:
                del d[i]

    def drop_open(self) -> None:
        """Forget the segments of the step in progress (its time so far is left out)."""
        self._segments = []
        self._start = None

    def poll(self) -> None:
        """Resolve finished steps without blocking (a step is done when its last event is)."""
        while self._pending and self._pending[0][1][-1][1].query():
            self._resolve(*self._pending.popleft())

    def reset(self) -> None:
        """Forget every step (the steps were re-numbered)."""
        self._pending.clear()
        self._segments = []
        self.device_s.clear()
        self.device_window.clear()
        self._start = None
        self._origin = None

    def drain(self) -> None:
        """Wait for the remaining events (only at watch exit, outside the user's loop)."""
        while self._pending:
            idx, segments = self._pending.popleft()
            segments[-1][1].synchronize()
            self._resolve(idx, segments)
        self._start = None
        self._segments = []
        # No CUDA event may outlive the watch: a watch left in a reference cycle is freed
        # by a later GC pass, and if that pass runs in a forked DataLoader worker, the
        # event's destructor touches CUDA there and aborts the worker ("CUDA error:
        # initialization error" in ExchangeDevice).
        self._origin = None


SYNC_WARNING = "called a synchronizing CUDA operation"


class SyncCounter:
    """Counts synchronizing CUDA calls and where user code made them.

    Uses ``torch.cuda.set_sync_debug_mode('warn')`` and a ``warnings.showwarning`` filter that
    swallows only those warnings (others still reach the user), both restored on exit.
    """

    def __init__(self) -> None:
        self.count = 0
        self.sites: Counter[str] = Counter()
        self._prev_mode: int | None = None
        self._prev_show: Any = None
        self._filters: Any = None

    def __enter__(self) -> SyncCounter:
        self._prev_mode = torch.cuda.get_sync_debug_mode()
        self._prev_show = warnings.showwarning
        self._filters = warnings.filters[:]
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._prev_mode is not None:
            torch.cuda.set_sync_debug_mode(self._prev_mode)
        warnings.showwarning = self._prev_show
        if self._filters is not None:
            warnings.filters[:] = self._filters  # type: ignore[index]

    def _show(self, message: Warning | str, category: type[Warning], filename: str,
              lineno: int, file: Any = None, line: str | None = None) -> None:
        if SYNC_WARNING in str(message):
            self.count += 1
            self.sites[_user_site()] += 1
            return
        self._prev_show(message, category, filename, lineno, file, line)


def _user_site() -> str:
    """The innermost stack frame outside torch and redline: where the user caused the sync."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        filename = frame.filename
        if ("/torch/" in filename or "/redline/" in filename or filename.startswith("<frozen")
                or "warnings" in filename):
            continue
        return f"{filename}:{frame.lineno}"
    return "<unknown>"


@dataclass(slots=True, kw_only=True)
class CudaMemory:
    """Peak device memory of the window (caching allocator statistics; no sync)."""

    total_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int


def reset_peak_memory(device: torch.device) -> None:
    torch.cuda.reset_peak_memory_stats(device)


def read_memory(device: torch.device) -> CudaMemory:
    props = torch.cuda.get_device_properties(device)
    return CudaMemory(
        total_bytes=int(props.total_memory),
        peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
        peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
    )
