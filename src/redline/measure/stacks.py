"""Where the time outside every timed phase goes: the training thread's Python stack, sampled
from the CPU sampler's thread and aggregated by the user's own call sites, and garbage-collection
pauses, timed exactly through ``gc.callbacks``.

A tick (every ``interval_s``, on the sampler's thread, never on the training thread) reads one
list length while the loop is inside a phase and returns: steps spent inside phases pay nothing
more. Only outside every phase does it read the loop's frame (``sys._current_frames``) and walk
it. Frames of torch, the standard library and redline are folded into the user's line that
called them (the innermost frame of a file outside the interpreter's library and site-packages);
a third-party package under that line is kept as ``via``. A tick weighs the wall time since the
previous tick less the GC pauses in it (timed apart): a call that holds the GIL and so delays
the tick still counts for its length, at the line it returned to.

Every tick still takes the GIL, and a loop that holds it pays a forced thread switch for each
(tens to hundreds of µs where the switch crosses cores of a busy host). So ticks come every
:data:`SLOW_TICK_S` during warm-up, where nothing is recorded, and in the measured window while
the share of its samples outside the phases stays below :data:`SLOW_BELOW_SHARE`, where no
host-work finding can reach its threshold. The period depends on the samples taken before a
tick, never on where the loop is at that tick, so each tick's weight (the time since the one
before) stays unbiased; a slowed period costs variance, not bias. The share is that of the
samples, whose weights are capped, not the exact time outside the phases: a loop that holds the
GIL outside them for long stretches samples a lower share, and then only loses samples.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import os
import random
import re
import sys
import sysconfig
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from types import CodeType, FrameType
from typing import NamedTuple

from redline.measure.timeline import StepTracker

KINDS: tuple[str, ...] = ("checkpoint", "logging", "gc", "batch", "loss", "optimizer", "loader",
                          "code")
"""What the work at a site is, recognised from the calls under it and its source line: saving
checkpoints, logging and host reads of tensor values, explicit garbage collection, batches
assembled in the loop, the loss and the optimizer's per-step helpers (``zero_grad``, gradient
clipping: training work, not removable host work), DataLoader work outside the fetch, and other
code."""

TRAINING_KINDS = frozenset({"loss", "optimizer"})
"""Kinds that are part of every training step: reported where the time went, never as work to
remove."""

TICK_WEIGHT_CAP = 4
"""A tick weighs at most this many periods of wall time (see :meth:`CodeSampler.tick`)."""

SLOW_TICK_S = 0.05
"""The tick's period during warm-up and while the outside share is low (the configured period
if that is longer): a tenth of the default period's thread switches."""

SLOW_BELOW_SHARE = 0.01
"""Below this share of the sampled time outside every phase (a fifth of the lowest host-work
threshold, ``HOST_WORK_MIN_FRACTION`` = 5 % of the step), ticks slow to :data:`SLOW_TICK_S`;
they speed up again at :data:`FAST_FROM_SHARE` (the gap keeps the period from flapping)."""

FAST_FROM_SHARE = 0.02
"""The outside share at which slowed ticks come at the configured period again."""

DECIDE_AFTER_TICKS = 100
"""Ticks of the measured window at the configured period before the share is trusted."""

SAMPLES_KEPT = 50_000
"""Per-step samples kept for the periodic-stall analysis (the most recent ones)."""

SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread-switch interval while the sampler runs (``sys.setswitchinterval``;
CPython's default is 5 ms, set back when the watch closes). A thread that wants the GIL asks
its holder to let go only after waiting that long, so with 5 ms a tick that falls in a stretch
of pure-Python code lands wherever the loop next releases the GIL itself: for a per-step metric
in pure Python (~8 ms of a ~10 ms step) beside a DataLoader, 47 of 48 ticks landed in its
collate (``torch.stack`` releases the GIL), and the metric's line was never named. At 1 ms the
ticks split the step as the phases' clock does (87 % outside the phases against 82 %). The
loop pays the same one forced switch a tick as before; Python threads of the user's that
compete for the GIL switch more often while the watch measures (DataLoader workers forked
meanwhile keep the interval: it is copied at the fork)."""

JITTER = (0.5, 1.5)
"""Each tick's period is drawn uniformly from this range times its nominal period: a fixed
period can lock in step with a loop whose step time is near a multiple of it and sample the
same moment of every step (aliasing); a random one of the same mean cannot."""


def shorten_switch_interval(stack: ExitStack, interval_s: float = SWITCH_INTERVAL_S) -> None:
    """Lower the interpreter's switch interval to ``interval_s`` until ``stack`` closes (see
    :data:`SWITCH_INTERVAL_S`); a value already lower is kept, and one the program changed in
    the meantime is not overwritten at the close."""
    before = sys.getswitchinterval()
    if before <= interval_s:
        return
    sys.setswitchinterval(interval_s)
    ours = sys.getswitchinterval()  # as the interpreter stores it (whole microseconds)

    def restore() -> None:
        if sys.getswitchinterval() == ours:
            sys.setswitchinterval(before)

    stack.callback(restore)

_USER, _TORCH, _REDLINE, _STDLIB, _THIRD = range(5)

_LOGGING_PACKAGES = frozenset({
    "wandb", "mlflow", "tensorboard", "tensorboardX", "tqdm", "neptune", "comet_ml", "clearml",
    "aim", "rich", "loguru", "structlog",
})
_CHECKPOINT_PACKAGES = frozenset({"safetensors", "orbax", "dill", "joblib"})

_LINE_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("checkpoint", re.compile(
        r"\btorch\.save\(|\.state_dict\(|save_checkpoint|save_pretrained|\bpickle\.dump"
        r"|\bsafetensors")),
    ("gc", re.compile(r"\bgc\.collect\(")),
    ("logging", re.compile(
        r"\bprint\(|\.item\(\)|\.tolist\(\)|\blog(?:ger|ging)?\.(?:info|debug|warning|log|error)\("
        r"|\.write\(|\bjson\.dumps?\(|\.add_scalars?\(|\bwandb\.log\(|\bmlflow\.log"
        r"|\.numpy\(\)|\.cpu\(\)")),
    ("batch", re.compile(
        r"\btorch\.(?:tensor|stack|cat|as_tensor|from_numpy)\(|\bnp\.(?:stack|array|asarray"
        r"|concatenate)\(|\brandom\.(?:sample|choices?|shuffle)\(|\brandperm\(")),
    # the loss computed on the forward's output in the loop's own line (`loss = model(x)
    # .square().mean()`, `loss = criterion(out, y)` where criterion is no module)
    ("loss", re.compile(r"\b\w*loss\w*\s*=[^=]|\bcriterion\(|\bloss_fn\(")),
)
"""Source-line patterns for calls that have no Python frame of their own (builtins, C methods:
``print``, ``Tensor.item``, ``file.write``, ``gc.collect``, ``torch.stack``)."""

_NAME_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("checkpoint", re.compile(r"checkpoint|(?:^|_)save(?:_|$)")),
    ("logging", re.compile(r"(?:^|_)(?:log|logs|logging|print)(?:_|$)")),
    ("batch", re.compile(r"(?:^|_)(?:get_|make_|build_|next_)?batch(?:es)?(?:_|$)|collate")),
)
"""Function-name hints, read from the user's innermost function and its caller when neither the
calls under the line nor the line itself say what the work is."""


class SiteKey(NamedTuple):
    """One call site of the user's code, and what runs under it."""

    file: str
    line: int
    function: str
    kind: str
    via: str | None
    """The innermost third-party package call under the line ('numpy:mean'), or the torch
    function that names the kind ('torch.serialization:save'), if any."""


def _library_roots() -> tuple[list[str], str, str | None]:
    paths = sysconfig.get_paths()
    std = sorted({os.path.join(os.path.realpath(paths[k]), "") for k in ("stdlib", "platstdlib")
                  if k in paths})
    red = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "")
    torch_module = sys.modules.get("torch")
    torch_file = getattr(torch_module, "__file__", None)
    tdir = os.path.join(os.path.dirname(os.path.realpath(torch_file)), "") if torch_file else None
    return std, red, tdir


class _FileClass(NamedTuple):
    cls: int
    rel: str
    """Path inside its root ('serialization.py', 'json/encoder.py'); the file for user code."""
    package: str
    """Top-level module ('json', 'wandb'), '' for user code."""


class CodeSampler:
    """Samples the training thread's stack while it is outside every timed phase.

    Args:
        tracker (StepTracker): the watch's tracker (read, never written, from the tick).
        thread_ident (int): ``threading.get_ident()`` of the training thread.
        measuring (Callable[[], bool]): whether the watch is in its measured window now.
        gc_pauses (GcPauses | None): GC timing, whose pauses are taken out of the ticks.
        interval_s (float): the period the ticks are meant to come at.
        longest_s (float | None): the longest wait the ticking thread allows between ticks
            (the CPU sampler's interval); the slowed period is at most this.
        jitter (tuple[float, float]): the range each period is drawn from, as multiples of
            the nominal one (:data:`JITTER`; ``(1, 1)`` for a fixed period).
    """

    def __init__(self, tracker: StepTracker, thread_ident: int,
                 measuring: Callable[[], bool], gc_pauses: GcPauses | None = None,
                 interval_s: float = 0.005, longest_s: float | None = None,
                 jitter: tuple[float, float] = JITTER) -> None:
        self._tracker = tracker
        self._jitter = jitter
        self._longest_s = longest_s
        self._fast_s = interval_s
        slow_s = max(interval_s, SLOW_TICK_S)
        self.slow_interval_s = slow_s if longest_s is None else max(interval_s,
                                                                    min(slow_s, longest_s))
        """The period of the ticks in warm-up and while little time is outside the phases."""
        self._slow = False
        self._window_open = False
        self._outside_seen_s = 0.0
        self._max_dt = TICK_WEIGHT_CAP * interval_s
        self._ident = thread_ident
        self._measuring = measuring
        self._gc = gc_pauses
        self._gc_seen = 0.0
        self._last: float | None = None
        self._std, self._redline, self._torch = _library_roots()
        self._files: dict[str, _FileClass] = {}
        self._kinds: dict[tuple[object, ...], tuple[str, str | None]] = {}
        self.weights: dict[SiteKey, list[float]] = {}
        """Site → [seconds, samples], over the measured window's closed steps."""
        self.per_step: deque[tuple[int, SiteKey, float]] = deque(maxlen=SAMPLES_KEPT)
        """(step index, site, seconds) of the most recent samples outside the phases."""
        self.outside_s = 0.0
        """Sampled seconds outside every phase (GC pauses taken out)."""
        self.inside_s = 0.0
        """Sampled seconds inside a phase."""
        self.ticks = 0
        """Ticks in the measured window."""
        self.unattributed = 0
        """Samples outside the phases whose stack held no frame to name (no Python frame)."""
        self._pending: list[tuple[int, SiteKey, float, float]] = []
        """(step, site, seconds, tick time) of the samples of the step in progress."""
        self._pending_step = -1
        self._rng = random.Random()
        """The ticks' jitter: a generator of its own, so the user's random stream is untouched."""

    # -- the tick, on the sampler's thread ----------------------------------------------------
    def tick(self, now: float) -> float:
        """Take one sample at ``now``; returns the seconds until the next tick, drawn around
        the nominal period (:data:`JITTER`)."""
        period_s = self._tick(now) * self._rng.uniform(*self._jitter)
        # never past the ticking thread's own interval (its samples are not delayed)
        return period_s if self._longest_s is None else min(period_s, self._longest_s)

    def _tick(self, now: float) -> float:
        last, self._last = self._last, now
        measuring = self._measuring()
        if last is None or not measuring or not self._window_open:
            # Warm-up, or the window's first tick: the time since the tick before lies (partly)
            # before the window, so it is weighed by no one.
            if self._gc is not None:
                self._gc_seen = self._gc.paused_s(now)
            self._window_open = measuring
            return self._fast_s if measuring else self.slow_interval_s
        elapsed_s = now - last
        gcp = self._gc
        if gcp is not None:
            # a tick may land inside a collection (a finalizer's Python code lets the GIL go):
            # the pause so far is read with the collection still open
            seen = gcp.paused_s(now)
            elapsed_s = max(0.0, elapsed_s - (seen - self._gc_seen))
            self._gc_seen = seen
        # A long gap means the sampler's thread was held off (no CPU for it, or the loop held
        # the GIL): whatever runs when it gets back is where the loop releases the GIL, not
        # where it spent the gap. The gap is capped, so the split follows the sample counts.
        elapsed_s = min(elapsed_s, self._max_dt)
        self.ticks += 1
        # decided before this sample counts: the period never follows where the loop is now
        period_s = self._period()
        if not self._tracker.outside_phases():
            self.inside_s += elapsed_s
            return period_s
        self._outside_seen_s += elapsed_s
        frame = sys._current_frames().get(self._ident)
        if frame is None:
            self.unattributed += 1
            return period_s
        key = self._site(frame)
        if key is None:
            self.unattributed += 1
            return period_s
        # A sample counts once its step has closed: the time after the last step's end (the
        # framework's end-of-training work, the watch's own close) is no step's, and the
        # steps' time outside the phases that the samples split does not hold it.
        step = self._tracker.closed
        if step != self._pending_step:
            self._commit()
            self._pending_step = step
        self._pending.append((step, key, elapsed_s, now))
        return period_s

    def _period(self) -> float:
        """The next tick's period, from the share of the window's samples before this tick
        outside the phases (see the module's docstring)."""
        if self.ticks <= DECIDE_AFTER_TICKS:
            return self._fast_s
        share = self._outside_seen_s / max(self._outside_seen_s + self.inside_s, 1e-9)
        self._slow = share < (FAST_FROM_SHARE if self._slow else SLOW_BELOW_SHARE)
        period_s = self.slow_interval_s if self._slow else self._fast_s
        # a slowed tick may be held off as long as a normal one, relative to its period
        self._max_dt = TICK_WEIGHT_CAP * period_s
        return period_s

    def settle(self) -> None:
        """Count the samples of the step in progress if it has closed since; drop them if not
        (read after the ticks stopped: they were taken after the last step's end)."""
        if self._pending and self._tracker.closed != self._pending_step:
            self._commit()
        self._pending.clear()

    def _commit(self) -> None:
        # The step has closed: the stretches between its evaluation forwards that the tracker
        # bridged into evaluation are known, and samples there are evaluation's, not lines'.
        spans = self._recent_spans(self._pending[0][3]) if self._pending else []
        for step, key, elapsed_s, at in self._pending:
            if spans and any(start <= at <= end for start, end in spans):
                self.inside_s += elapsed_s
                continue
            self.outside_s += elapsed_s
            weight = self.weights.get(key)
            if weight is None:
                self.weights[key] = [elapsed_s, 1.0]
            else:
                weight[0] += elapsed_s
                weight[1] += 1.0
            self.per_step.append((step, key, elapsed_s))
        self._pending.clear()

    def _recent_spans(self, since: float) -> list[tuple[float, float]]:
        """The tracker's bridged evaluation spans that end at or after ``since``, read from the
        newest back (they are in time order): a long run keeps thousands, a step's samples
        need the last few. Read by index, not by iterating, as the training thread may append
        meanwhile (an index then shifts by one: a span read twice, which changes nothing)."""
        spans = self._tracker.evaluation_spans
        recent: list[tuple[float, float]] = []
        i = -1
        while True:
            try:
                span = spans[i]
            except IndexError:
                return recent
            if span[1] < since:
                return recent
            recent.append(span)
            i -= 1

    # -- frames -------------------------------------------------------------------------------
    def _classify(self, filename: str) -> _FileClass:
        file_class = self._files.get(filename)
        if file_class is not None:
            return file_class
        file_class = _classify_file(filename, self._std, self._redline, self._torch)
        if len(self._files) > 20_000:
            self._files.clear()
        self._files[filename] = file_class
        return file_class

    def _site(self, frame: FrameType) -> SiteKey | None:
        inner: list[CodeType] = []
        cur_frame: FrameType | None = frame
        user: FrameType | None = None
        while cur_frame is not None and len(inner) < 256:
            code = cur_frame.f_code
            if self._classify(code.co_filename).cls == _USER:
                user = cur_frame
                break
            inner.append(code)
            cur_frame = cur_frame.f_back
        if user is None:
            # No frame of the user's: name the innermost third-party (else library) frame.
            named = next((inner_code for inner_code in inner
                          if self._classify(inner_code.co_filename).cls == _THIRD),
                         inner[0] if inner else None)
            if named is None:
                return None
            kind, via = self._kind(tuple(inner), None, 0, None)
            return SiteKey(named.co_filename, named.co_firstlineno, named.co_name, kind, via)
        code = user.f_code
        line = user.f_lineno or code.co_firstlineno
        caller = user.f_back
        caller_code = caller.f_code if caller is not None else None
        kind, via = self._kind(tuple(inner), code, line, caller_code)
        return SiteKey(code.co_filename, line, code.co_name, kind, via)

    def _kind(self, inner: tuple[CodeType, ...], code: CodeType | None, line: int,
              caller: CodeType | None) -> tuple[str, str | None]:
        cache_key = (inner, code, line, caller)
        hit = self._kinds.get(cache_key)
        if hit is not None:
            return hit
        found = self._library_kind(inner)
        if found is None and code is not None:
            found = _line_kind(code.co_filename, line, code.co_name,
                               caller.co_name if caller is not None else "")
        kind, via = found if found is not None else ("code", None)
        if via is None:
            via = next((f"{file_class.package}:{inner_code.co_name}" for inner_code in inner
                        if (file_class := self._classify(inner_code.co_filename)).cls == _THIRD), None)
        if len(self._kinds) > 20_000:
            self._kinds.clear()
        self._kinds[cache_key] = (kind, via)
        return kind, via

    def _library_kind(self, inner: tuple[CodeType, ...]) -> tuple[str, str | None] | None:
        """The kind named by the innermost library call that has one."""
        for inner_code in inner:
            file_class = self._classify(inner_code.co_filename)
            kind = _library_kind(file_class, inner_code.co_name)
            if kind is not None:
                module = file_class.rel.removesuffix(".py").replace("/", ".").replace(os.sep, ".")
                module = module.removesuffix(".__init__")
                prefix = "torch." if file_class.cls == _TORCH else ""
                return kind, f"{prefix}{module}:{inner_code.co_name}"
        return None


def _library_kind(fc: _FileClass, function: str) -> str | None:
    if fc.cls == _TORCH:
        rel = fc.rel
        if (rel == "serialization.py" or rel.startswith("distributed/checkpoint/")
                or function == "state_dict"):
            return "checkpoint"
        if rel.startswith("utils/tensorboard/"):
            return "logging"
        if rel == "nn/functional.py" or rel.startswith("nn/modules/loss"):
            return "loss"
        if rel.startswith(("optim/", "nn/utils/clip_grad")):
            return "optimizer"
        if rel.startswith("utils/data/"):
            return "loader"
    elif fc.cls == _STDLIB:
        if fc.package in ("logging", "json", "csv", "pprint"):
            return "logging"
        if fc.package in ("pickle", "shelve"):
            return "checkpoint"
    elif fc.cls == _THIRD:
        if fc.package in _LOGGING_PACKAGES:
            return "logging"
        if fc.package in _CHECKPOINT_PACKAGES:
            return "checkpoint"
    return None


def _line_kind(filename: str, line: int, function: str,
               caller: str) -> tuple[str, str | None] | None:
    text = linecache.getline(filename, line)
    for kind, pattern in _LINE_KINDS:
        if pattern.search(text):
            return kind, None
    for name in (function, caller):
        for kind, pattern in _NAME_KINDS:
            if name and pattern.search(name):
                return kind, None
    return None


def source_line(filename: str, line: int, limit: int = 120) -> str | None:
    """The stripped source line (cut to ``limit`` characters), None where unreadable."""
    text = linecache.getline(filename, line).strip()
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


class GcPauses:
    """Garbage-collection pauses, exact: ``gc.callbacks`` brackets every collection.

    A callback costs one clock read at each end of a collection (CPython collects the youngest
    generation every ~700 net allocations); the caller of a full collection (generation 2:
    ``gc.collect()`` or a full automatic one) is read from the stack at its start.

    Args:
        tracker (StepTracker): whether a pause fell outside every phase.
        measuring (Callable[[], bool]): whether the watch is in its measured window now.
    """

    def __init__(self, tracker: StepTracker, measuring: Callable[[], bool]) -> None:
        self._tracker = tracker
        self._measuring = measuring
        self._t0 = 0.0
        self._gen = 0
        self._caller: tuple[str, int, str] | None = None
        self._clock = time.perf_counter
        self._open = False
        self._all_s = 0.0
        self.pause_s = 0.0
        """Seconds in collections during the measured window (every thread's)."""
        self.outside_s = 0.0
        """Of ``pause_s``, the seconds while the training loop was outside every phase."""
        self.collections = [0, 0, 0]
        """Collections per generation in the measured window."""
        self.full_callers: dict[tuple[str, int, str], list[float]] = {}
        """(file, line, function) of the user's code that was running when a full collection
        began → [seconds, collections]."""
        self._std, self._redline, self._torch = _library_roots()

    def paused_s(self, now: float) -> float:
        """Seconds of every collection since this was built, one still open counted to
        ``now`` (read by the stack sampler from its thread)."""
        return self._all_s + (now - self._t0 if self._open else 0.0)

    def install(self, stack: ExitStack) -> None:
        gc.callbacks.append(self._callback)
        stack.callback(self._remove)

    def _remove(self) -> None:
        with contextlib.suppress(ValueError):  # removed by someone else: nothing to undo
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gen = gen = info["generation"]
            if gen == 2:
                self._caller = self._user_caller()
            self._t0 = self._clock()
            self._open = True
            return
        elapsed_s = self._clock() - self._t0
        self._open = False
        self._all_s += elapsed_s
        if not self._measuring():
            return
        gen = self._gen
        self.pause_s += elapsed_s
        self.collections[gen] += 1
        if self._tracker.outside_phases():
            self.outside_s += elapsed_s
        if gen == 2 and self._caller is not None:
            caller_weight = self.full_callers.setdefault(self._caller, [0.0, 0.0])
            caller_weight[0] += elapsed_s
            caller_weight[1] += 1.0

    def _user_caller(self) -> tuple[str, int, str] | None:
        if not self._measuring():
            return None
        # The frame that triggered the collection: none where a collection starts with no
        # Python frame below the callback (sys._getframe(2) would raise there).
        frame: FrameType | None = sys._getframe(1).f_back
        while frame is not None:
            name = frame.f_code.co_filename
            if _classify_file(name, self._std, self._redline, self._torch).cls == _USER:
                return name, frame.f_lineno or frame.f_code.co_firstlineno, frame.f_code.co_name
            frame = frame.f_back
        return None


def _classify_file(filename: str, std: list[str], red: str, torch_dir: str | None
                   ) -> _FileClass:
    """Whose a code object's file is: redline's, torch's, a third-party package's, the
    standard library's, or the user's (the roots from :func:`_library_roots`). One classifier
    for the stack sampler and the GC pauses' caller."""
    if filename.startswith("<"):
        # '<frozen importlib._bootstrap>' is the library; '<string>', '<stdin>', a
        # notebook's '<ipython-input-…>' are the user's
        return (_FileClass(_STDLIB, filename, "importlib") if filename.startswith("<frozen")
                else _FileClass(_USER, filename, ""))
    path = os.path.realpath(filename)
    if path.startswith(red):
        return _FileClass(_REDLINE, path[len(red):], "redline")
    if torch_dir is not None and path.startswith(torch_dir):
        return _FileClass(_TORCH, path[len(torch_dir):].replace(os.sep, "/"), "torch")
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        i = path.find(marker)
        if i >= 0:
            rel = path[i + len(marker):]
            top = rel.split(os.sep, 1)[0]
            return _FileClass(_THIRD, rel, top.removesuffix(".py"))
    for root in std:
        if path.startswith(root):
            rel = path[len(root):]
            top = rel.split(os.sep, 1)[0]
            return _FileClass(_STDLIB, rel, top.removesuffix(".py"))
    return _FileClass(_USER, filename, "")