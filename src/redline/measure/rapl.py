"""CPU package energy from Linux RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``).

The counter is in microjoules and wraps at ``max_energy_range_uj``; reading it usually needs
root since Linux 5.10 (CVE-2020-8694). Unreadable → energy is unknown, with the reason.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass


@dataclass(slots=True, kw_only=True)
class _Domain:
    path: str
    max_uj: int
    start_uj: int


class RaplMeter:
    """Energy of all CPU packages between :meth:`start` and :meth:`joules`."""

    def __init__(self, root: str = "/sys/class/powercap") -> None:
        self.root = root
        self.domains: list[_Domain] = []
        self.reason: str | None = None

    def start(self) -> bool:
        # Top-level package domains only (intel-rapl:0, :1 …); sub-domains (core, dram) are
        # parts of them and would double count.
        paths = sorted(p for p in glob.glob(os.path.join(self.root, "intel-rapl:*"))
                       if os.path.basename(p).count(":") == 1)
        if not paths:
            self.reason = f"no RAPL domains under {self.root} (not an Intel/AMD host with powercap)"
            return False
        try:
            self.domains = [_Domain(path=p, max_uj=_read(os.path.join(p, "max_energy_range_uj")),
                                    start_uj=_read(os.path.join(p, "energy_uj"))) for p in paths]
        except (OSError, ValueError) as e:
            self.reason = f"RAPL energy counters are not readable ({e}); they need root"
            self.domains = []
            return False
        return True

    def joules(self) -> float | None:
        if not self.domains:
            return None
        total = 0
        try:
            for d in self.domains:
                now = _read(os.path.join(d.path, "energy_uj"))
                total += now - d.start_uj if now >= d.start_uj else now + d.max_uj - d.start_uj
        except (OSError, ValueError) as e:
            self.reason = f"RAPL counter became unreadable ({e})"
            return None
        return total / 1e6


def _read(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())
