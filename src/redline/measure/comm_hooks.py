"""The loop's own ``torch.distributed`` collectives, timed as the 'comm' phase.

The host is blocked in a collective it calls (an ``all_reduce`` of a metric, a ``barrier``):
that time is neither compute nor data. DDP's and FSDP's gradient collectives run inside
backward and forward, in C++; their waits are read from the flight recorder instead
(:mod:`redline.measure.collectives`). An ``async_op=True`` call is timed until it returns its
handle; the later ``wait()`` is not seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from redline.measure.patching import compiling, patch
from redline.measure.step_record import COMM
from redline.measure.timeline import StepTracker

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
               "reduce", "barrier", "all_to_all", "all_to_all_single", "gather", "scatter",
               "send", "recv")
"""``torch.distributed`` functions whose host time is the 'comm' phase."""


def install_collectives(stack: ExitStack, tracker: StepTracker, tid: int) -> None:
    """Patch every collective of :data:`COLLECTIVES` (in ``torch.distributed`` and
    ``torch.distributed.distributed_c10d``) until ``stack`` closes."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    for name in COLLECTIVES:
        orig = getattr(c10d, name, None)
        if orig is None:
            continue
        timed = _timed(orig, tracker, tid)
        if getattr(dist, name, None) is orig:
            patch(stack, dist, name, timed)
        patch(stack, c10d, name, timed)


def _timed(orig: Callable[..., Any], tracker: StepTracker, tid: int) -> Callable[..., Any]:
    clock, get_ident = time.perf_counter, threading.get_ident

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling() or get_ident() != tid:
            return orig(*args, **kwargs)
        tracker.enter(COMM, clock())
        try:
            return orig(*args, **kwargs)
        finally:
            tracker.exit(COMM, clock())

    return wrapper
