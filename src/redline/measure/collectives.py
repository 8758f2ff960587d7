"""When this rank arrived at each collective: PyTorch's flight recorder, read at watch exit.

The flight recorder (``torch._C._distributed_c10d._dump_fr_trace``) keeps the last collectives
of every process group — DDP's gradient all-reduces and FSDP's all-gathers included, which run
in C++ and no Python hook sees — each with its sequence number in its group and the wall-clock
time it was enqueued (``time_created_ns``). The n-th collective of a group is the same
collective on every rank, so the enqueue times, put on one clock, are the ranks' arrivals: the
last to arrive kept the others waiting (per-rank step times are equal under DDP and hide this).
It records on gloo too (where completion times stay empty), and is on by default (its buffer:
``TORCH_FR_BUFFER_SIZE``).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """This rank's arrival at one collective."""

    group: str
    """The process group's name ('0' is the default group)."""
    seq: int
    """The collective's sequence number in its group: the same collective on every rank."""
    name: str
    """E.g. 'gloo:all_reduce', 'nccl:all_reduce'."""
    created_ns: int
    """Wall-clock time it was enqueued on this rank (``time.time_ns`` scale)."""


def read_arrivals(start_ns: int, end_ns: int) -> tuple[list[Arrival], str | None]:
    """(arrivals enqueued in [start_ns, end_ns], why none could be read, if so)."""
    try:
        import torch

        c10d = getattr(torch._C, "_distributed_c10d", None)
        dump = getattr(c10d, "_dump_fr_trace", None)
        if dump is None:
            return [], "this torch has no flight recorder (torch._C._distributed_c10d)"
        data: Any = pickle.loads(dump())
    except Exception as e:  # the recorder is best effort: say why, never stop the report
        return [], f"the flight recorder could not be read ({type(e).__name__}: {e})"
    out = []
    for entry in data.get("entries", []):
        t = entry.get("time_created_ns")
        seq = entry.get("collective_seq_id")
        if not isinstance(t, int) or not isinstance(seq, int) or not start_ns <= t <= end_ns:
            continue
        pg = entry.get("process_group") or ("?", "")
        out.append(Arrival(group=str(pg[0]), seq=seq, name=str(entry.get("profiling_name", "")),
                   created_ns=t))
    if not out:
        return [], ("no collective was recorded in the measured window (is the flight recorder "
                    "off? TORCH_FR_BUFFER_SIZE=0 turns it off)")
    return out, None
