"""A Ctrl-C that Python would drop, delivered again.

Python runs a signal handler wherever the main thread is, and that may be code whose
exceptions Python prints as "Exception ignored" and drops: a garbage-collection callback (the
watch's GC pause timer is one), a weakref callback or a ``__del__`` run by a collection. A
Ctrl-C whose KeyboardInterrupt is raised there is lost, and the script runs on. Imports collect
often, so it happens most during a script's start-up. While a watch runs, every such dropped
exception passes through ``sys.unraisablehook``; :class:`KeepInterrupts` sends the signal
again from there, and it is handled once the callback has returned.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

REDELIVER_S = 0.005
"""Delay before a signal whose exception was dropped is sent again."""


def redeliver_signal(signum: int) -> None:
    """Send ``signum`` to this process again in :data:`REDELIVER_S`, from a timer thread.

    Args:
        signum: the signal to send again.
    """
    timer = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def forget_unhandled_interrupt() -> None:
    """Clear CPython's mark of an unhandled KeyboardInterrupt, for a Ctrl-C redline caught.

    A KeyboardInterrupt that leaves code run by ``exec()`` or ``eval()`` of a string (dataclass
    and namedtuple creation do that: ``dataclasses._create_fn``) is marked unhandled by the
    interpreter, whoever catches it later (``run_eval_code_obj`` in CPython's
    Python/pythonrun.c sets ``_PyRuntime.signals.unhandled_keyboard_interrupt``). A process
    started with ``python -m`` then ends by killing itself with SIGINT, whatever exit status it
    asked for: a Ctrl-C during the script's imports would end ``redline doctor`` with a signal
    instead of its status 130 after the report. The same function clears the mark before it
    runs any string, so running an empty one clears it."""
    exec("")  # the empty string: nothing runs


class KeepInterrupts:
    """While entered, a KeyboardInterrupt that Python drops as unraisable, raised by Python's
    own Ctrl-C handler, makes the same Ctrl-C arrive again. Other unraisable exceptions, and a
    KeyboardInterrupt under another SIGINT handler (``redline doctor``'s, which keeps its own),
    go to the hook that was installed before."""

    def __init__(self) -> None:
        self._previous: Any = None

    def __enter__(self) -> KeepInterrupts:
        self._previous = sys.unraisablehook
        sys.unraisablehook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if sys.unraisablehook == self._hook:  # another hook installed since stays
            sys.unraisablehook = self._previous

    def _hook(self, unraisable: Any) -> None:
        if (unraisable.exc_type is KeyboardInterrupt
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            redeliver_signal(signal.SIGINT)
            return
        self._previous(unraisable)
