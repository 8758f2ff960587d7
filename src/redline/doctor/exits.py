"""How a doctor run ends: the step limit's stop, SIGTERM and SIGINT, and ``os._exit``.

Each way out of the user's script ends with the report of the steps measured so far, or with a
line saying why there is none (docs/reliability.md, "A report on every exit path").
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn

from rich.console import Console

from redline.measure.interrupts import redeliver_signal

REAL_EXIT = os._exit
"""``os._exit`` itself, taken at import: what a second signal and the guard below call."""


class StopMeasurement(BaseException):
    """Raised from a step hook once the requested steps are measured."""


class Terminated(BaseException):
    """Raised in the main thread by the first SIGTERM (what Slurm and Kubernetes send before
    they kill a job), so the run ends the way Ctrl-C ends it: with the report so far."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


STOP_ATTEMPTS = 3
"""How often the step limit's stop is raised (at a step's end, then at each fetch or step)
before redline concludes the script catches it (a bare ``except:`` around the step, the fetch
or the epoch) and ends the run in place after the report, as ``os._exit`` does."""


class Signals:
    """How SIGTERM and SIGINT end a doctor run.

    While the script runs, SIGTERM raises :class:`Terminated` (SIGINT: KeyboardInterrupt, as
    always), so the run ends with the report so far. Once it has ended (:meth:`reporting`), a
    first signal is only recorded — the report of the steps so far is what it asks for, so it
    is finished and written, and :attr:`received` gives the exit status. After the first
    signal, the next one exits at once with 128 + its number. Off the main thread (where Python
    cannot handle signals) nothing changes; handlers are restored on exit."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._raising = True
        self._previous: dict[int, Any] = {}
        self._raised: tuple[BaseException, int] | None = None
        """What the first signal's handler raised, and the signal's number."""
        self._hook_before: Any = None
        self._excepthook_before: Any = None
        self._pid = os.getpid()

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            for s in self._previous:
                signal.signal(s, self._first)
            self._hook_before = sys.unraisablehook
            sys.unraisablehook = self._unraisable
            self._excepthook_before = sys.excepthook
            sys.excepthook = self._excepthook
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._hook_before is not None and sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._hook_before
        if self._excepthook_before is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._excepthook_before

    def reporting(self) -> None:
        """The script has ended: from now on a first signal does not interrupt the report.
        A handler the script installed is replaced by redline's again (its script has ended;
        left in place, its ``sys.exit`` would cut the report short)."""
        self._raising = False
        if self.received is None and self._previous and \
                threading.current_thread() is threading.main_thread():
            for s in self._previous:
                if signal.getsignal(s) != self._first:
                    signal.signal(s, self._first)

    def _first(self, signum: int, frame: object) -> None:
        for s in self._previous:
            signal.signal(s, self._at_once)
        self.received = signum
        _quiet_children()
        if not self._raising:
            return
        exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        self._raised = exc, signum
        raise exc

    def _unraisable(self, unraisable: Any) -> None:
        """Python ran the handler where it drops exceptions (a garbage-collection or weakref
        callback, a ``__del__``: redline's GC pause timer is one) and printed the one it
        raised as "Exception ignored": the signal would be lost and the script would run on to
        its end. The first signal's handler is put back and the signal sent again; it is
        handled once the callback has returned (:mod:`redline.measure.interrupts`)."""
        if self._raised is None or unraisable.exc_value is not self._raised[0]:
            self._hook_before(unraisable)
            return
        signum = self._raised[1]
        self._raised = None
        if threading.current_thread() is threading.main_thread():
            for s in self._previous:
                signal.signal(s, self._first)
        self.received = None
        redeliver_signal(signum)

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException,
                    tb: TracebackType | None) -> None:
        """In a process forked from the script's (a DataLoader worker: fork is the default
        start method on Linux) that a SIGTERM is about to end, a thread's exception is not
        printed. A signal to the process group reaches the workers as the main process stops
        mid-fetch; a worker's thread that serves tensors' file descriptors
        (``multiprocessing.resource_sharer._serve``) then sees its peer hang up, and where it
        runs before the worker's main thread takes the signal, it prints a traceback —
        cut off as the worker dies — into the report's stderr. The worker ends by the signal
        either way (PyTorch's worker handler takes the default action for a SIGTERM its
        parent did not send); only that half-printed traceback is left out."""
        if os.getpid() != self._pid and _terminating():
            return
        self._excepthook_before(exc_type, exc, tb)

    @staticmethod
    def _at_once(signum: int, frame: object) -> None:
        REAL_EXIT(128 + signum)


def _terminating() -> bool:
    """Whether a SIGTERM is pending for this process: sent, not yet taken by a thread that
    lets it through (the threads that serve file descriptors block every signal)."""
    return hasattr(signal, "sigpending") and signal.SIGTERM in signal.sigpending()


def _quiet_children() -> None:
    """Stop a child's death from raising in the main thread, for the rest of the process.

    A signal to the process group (``timeout``, Slurm, ``kill -- -PGID``, Ctrl-C in a terminal)
    reaches the DataLoader workers too, and they die with it; PyTorch's SIGCHLD handler
    (``torch.utils.data._utils.signal_handling``) then raises ``RuntimeError: DataLoader worker
    … is killed by signal`` wherever the main thread is — in the middle of the report. The
    job is ending and redline stops the workers itself, so their deaths are only reaped. Not
    restored: the process ends after the report, and a restored handler would raise at the
    next child's exit."""
    if hasattr(signal, "SIGCHLD"):
        signal.signal(signal.SIGCHLD, _child_exited)


def _child_exited(signum: int, frame: object) -> None:
    """A Python-level no-op (SIG_DFL here would make CPython report a pending SIGCHLD as
    'ignored due to race condition')."""


class OsExitGuard:
    """While the script runs, ``os._exit(n)`` in its main thread first finishes the report.

    ``os._exit`` ends the process at once (no ``finally``, no ``atexit``), so nothing after
    the script would run. The guard keeps that: nothing of the script is unwound; in place,
    ``finish(n)`` closes the watch and prints and writes the report, then the process exits
    with ``n``. Called from another thread it cannot close the watch under the training loop:
    it says the report is lost and why. In any other process (a DataLoader worker or a
    ``multiprocessing`` child forked from the script) it is ``os._exit`` itself."""

    def __init__(self, finish: Callable[[int], None]) -> None:
        self._finish = finish
        self._pid = os.getpid()
        self._ending = False

    def __enter__(self) -> OsExitGuard:
        os._exit = self._exit
        return self

    def __exit__(self, *exc: object) -> None:
        os._exit = REAL_EXIT

    def _exit(self, status: int) -> NoReturn:
        n = status
        if os.getpid() != self._pid or self._ending:
            REAL_EXIT(n)
        self._ending = True
        os._exit = REAL_EXIT
        if threading.current_thread() is threading.main_thread():
            try:
                self._finish(n)
            except BaseException as e:  # the report failed: the exit still happens, said
                print(f"redline doctor: the script called os._exit({n}); the report could not "
                      f"be finished ({type(e).__name__}: {e})", file=sys.stderr)
        else:
            print(f"redline doctor: the script called os._exit({n}) from thread "
                  f"{threading.current_thread().name!r}, which ends the process at once: no "
                  "report of the steps so far (end the run from the main thread, e.g. with "
                  "sys.exit, to get it)", file=sys.stderr)
        exit_now(n)


def exit_now(code: int) -> NoReturn:
    """End the process at once with ``code`` (``os._exit``), what was printed flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to say
            stream.flush()
    REAL_EXIT(code)


STUCK_GRACE_S = 3.0
"""How long after SIGINT/SIGTERM the main thread may take to run Python again before it is
taken as blocked in native code (a collective waiting for a rank that never comes)."""


class BlockedWatch:
    """For a rank of a multi-process job: a signal the main thread cannot take still ends the
    run with the report.

    Python runs signal handlers in the main thread between bytecodes; a rank blocked in a
    collective (gloo or NCCL waiting for a rank that hangs) never gets there, and the launcher
    kills it after its grace period, reportless. The C-level handler still writes the signal
    to a wakeup fd (``signal.set_wakeup_fd``): a thread reading it sees the signal, waits
    :data:`STUCK_GRACE_S` for the main thread's handler (``signals.received``), and when it
    has not run calls ``on_blocked(signum)`` (which reports and exits). A script that sets its
    own wakeup fd (asyncio) replaces this one."""

    def __init__(self, signals: Signals, on_blocked: Callable[[int], None],
                 grace_s: float = STUCK_GRACE_S) -> None:
        self._signals, self._on_blocked, self._grace = signals, on_blocked, grace_s
        self._fds: tuple[int, int] | None = None
        self._previous = -1
        self._closing = False

    def __enter__(self) -> BlockedWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not possible here: nothing watched
            os.close(r)
            os.close(w)
            return self
        self._fds = (r, w)
        threading.Thread(target=self._run, name="redline-blocked", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fds is None:
            return
        self._closing = True
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self._previous)
        with contextlib.suppress(OSError):
            os.write(self._fds[1], b"\0")  # wakes the thread, which closes the pipe

    def _run(self) -> None:
        assert self._fds is not None
        r, w = self._fds
        try:
            while not self._closing:
                got = os.read(r, 64)
                if self._closing or not got:
                    return
                sig = next((b for b in got if b in (signal.SIGINT, signal.SIGTERM)), None)
                if sig is None or self._signals.received is not None:
                    continue
                deadline = threading.Event()
                for _ in range(int(self._grace / 0.05)):
                    if self._signals.received is not None or self._closing:
                        break
                    deadline.wait(0.05)
                else:
                    self._on_blocked(sig)
                    return
        finally:
            for fd in (r, w):
                with contextlib.suppress(OSError):
                    os.close(fd)


class StderrConsole(Console):
    """A console whose broken pipe is an error to its caller (:func:`to_stderr`); rich's own
    handling sends stdout, not stderr, to /dev/null and exits with status 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def to_stderr(what: str | Callable[[], object]) -> None:
    """Print ``what`` (a line, or a function that prints) on stderr. Where its reader has gone
    (``2>&1 | head``: a broken pipe), redline's remaining output is dropped (stderr then writes
    to /dev/null, so neither a later line nor the flush at exit raises) and the run goes on to
    write its files and end with the script's exit status."""
    try:
        if callable(what):
            what()
        else:
            print(what, file=sys.stderr)
        sys.stderr.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
