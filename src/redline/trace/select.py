"""Which events an analysis sees: HTA's iteration filter and kernel classification."""

from __future__ import annotations

from functools import lru_cache

from redline.trace.events import RUNTIME_CATEGORIES, Event, RankTrace

COMPUTATION, COMMUNICATION, MEMORY, SYNC = "COMPUTATION", "COMMUNICATION", "MEMORY", "SYNC"
KERNEL_TYPES = (COMPUTATION, COMMUNICATION, MEMORY)
"""Types in the kernel-type breakdown, in HTA's order (which names overlaps: 'A overlapping B')."""


def kernel_type(e: Event) -> str:
    """HTA's classification: NCCL / gloo kernels communicate, Memcpy / Memset move memory,
    device-side synchronizations (cuda_sync, except 'Stream Wait Event' which HTA 0.5.0 counts
    as compute) are SYNC — time on the device that is neither; everything else computes."""
    return _kernel_type(e.name, e.cat)


@lru_cache(maxsize=65536)
def _kernel_type(n: str, cat: str) -> str:
    # Cached: a trace has thousands of events but a few hundred distinct kernel names.
    if n.startswith("nccl") or "gloo:" in n:
        return COMMUNICATION
    if "Memcpy" in n or "Memset" in n:
        return MEMORY
    if cat == "cuda_sync" and n != "Stream Wait Event":
        return SYNC
    return COMPUTATION


def filter_iterations(t: RankTrace) -> list[Event]:
    """Drop the last (incomplete) ProfilerStep, as HTA does by default.

    With at least two distinct ``ProfilerStep#N`` annotations: keep host events that start
    before the last step begins, and device events launched by them (matching correlation ids).
    With fewer, keep everything (HTA: 'the analysis result may not be accurate').
    """
    events = t.events
    steps = [e for e in events if e.stream == -1 and e.name.startswith("ProfilerStep")]
    if len({e.name for e in steps}) < 2:
        return events
    last_start = max(e.ts for e in steps)
    host = [e for e in events if e.stream == -1 and e.ts < last_start]
    launched = {e.corr for e in host}
    device = [e for e in events if e.stream >= 0 and e.corr >= 0 and e.corr in launched]
    return device + host


def runtime_launch_ts(events: list[Event]) -> dict[int, float]:
    """Correlation id → start of the runtime call that launched it."""
    return {e.corr: e.ts for e in events
            if e.stream == -1 and e.corr != -1 and e.cat in RUNTIME_CATEGORIES}
