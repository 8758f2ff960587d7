"""Peak dense FLOP/s per device and dtype, kept as data (``redline/data/peak_flops.json``).

A table that can be read, injected and tested, unlike an if/elif chain over ``lspci`` output
Unknown device or dtype → None, never a neighbour's peak.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakEntry:
    name: str
    match: tuple[str, ...]
    peak_tflops: dict[str, float]
    source: str


@lru_cache(maxsize=1)
def load_table() -> tuple[PeakEntry, ...]:
    raw: dict[str, Any] = json.loads(
        resources.files("redline").joinpath("data/peak_flops.json").read_text()
    )
    return tuple(
        PeakEntry(name=d["name"], match=tuple(d["match"]), peak_tflops=dict(d["peak_tflops"]),
                  source=d["source"])
        for d in raw["devices"]
    )


def find_device(device_name: str, table: tuple[PeakEntry, ...] | None = None) -> PeakEntry | None:
    """The table entry for a device name as ``torch.cuda.get_device_name()`` prints it."""
    # Whole tokens, not substrings: 'l4' must not match 'NVIDIA L40S'.
    tokens = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for entry in table if table is not None else load_table():
        if all(m in tokens for m in entry.match):
            return entry
    return None


def peak_flops(device_name: str, dtype: str,
               table: tuple[PeakEntry, ...] | None = None) -> tuple[float, str] | None:
    """(peak FLOP/s, source) for a device and a compute dtype ('fp32', 'tf32', 'bf16', ...)."""
    entry = find_device(device_name, table)
    if entry is None or dtype not in entry.peak_tflops:
        return None
    return entry.peak_tflops[dtype] * 1e12, f"{entry.name}: {entry.source}"
