"""Which rank this process is, and the job's own c10d store to exchange summaries through.

Under ``torchrun`` (or any launcher that sets ``RANK``/``WORLD_SIZE``) each process is one rank.
redline sends nothing over a new protocol: per-rank summaries travel through the job's own
store, the TCPStore that ``torchrun``'s agent serves at ``MASTER_ADDR:MASTER_PORT`` (the one
``init_process_group`` connects to), under keys prefixed ``redline/``. Every exchange has a
bounded timeout: a rank that crashed or never reports is named, never waited for forever.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

GATHER_TIMEOUT_S = float(os.environ.get("REDLINE_GATHER_TIMEOUT_S", "120"))
"""How long rank 0 waits for the other ranks' summaries after its own run ends."""


@dataclass(frozen=True, slots=True)
class RankInfo:
    """This process's place in the job (from the launcher's environment)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host: str
    run_id: str
    """The launch's id (torchrun's rendezvous id and restart count): keys of one launch never
    meet another's."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def rank_info(env: dict[str, str] | None = None) -> RankInfo:
    """The rank from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; a single
    process (rank 0 of 1) when they are not set."""
    e = os.environ if env is None else env

    def num(name: str, default: int) -> int:
        try:
            return int(e.get(name, default))
        except ValueError:
            return default

    run = f"{e.get('TORCHELASTIC_RUN_ID', 'job')}.{e.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return RankInfo(rank=num("RANK", 0), world_size=num("WORLD_SIZE", 1),
                    local_rank=num("LOCAL_RANK", 0),
                    local_world_size=num("LOCAL_WORLD_SIZE", num("WORLD_SIZE", 1)),
                    host=socket.gethostname(), run_id=run)


class JobStore:
    """A client of the job's c10d store (see the module docstring), with bounded waits."""

    def __init__(self, info: RankInfo, timeout_s: float = 30.0) -> None:
        from torch._C._distributed_c10d import TCPStore

        host = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if host is None or port is None:
            raise RuntimeError("MASTER_ADDR / MASTER_PORT are not set: no job store to reach")
        self.info = info
        self._store: Any = TCPStore(host, int(port), is_master=False,
                                         timeout=timedelta(seconds=timeout_s),
                                         wait_for_workers=False)
        self.prefix = f"redline/{info.run_id}"

    def put(self, key: str, value: bytes) -> None:
        self._store.set(f"{self.prefix}/{key}", value)

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` if it is set now (no waiting)."""
        fk = f"{self.prefix}/{key}"
        return bytes(self._store.get(fk)) if self._store.check([fk]) else None

    def gather(self, keys: list[str], timeout_s: float) -> dict[str, bytes]:
        """The values of ``keys`` present within ``timeout_s`` (missing ones left out)."""
        full = {k: f"{self.prefix}/{k}" for k in keys}
        out: dict[str, bytes] = {}
        deadline = time.monotonic() + timeout_s
        while True:
            for k, fk in full.items():
                if k not in out and self._store.check([fk]):
                    out[k] = bytes(self._store.get(fk))
            if len(out) == len(keys) or time.monotonic() >= deadline:
                return out
            time.sleep(0.05)


class ProgressBeacon:
    """Publishes this rank's step count every ``interval_s`` (one small store write, off the
    training thread), so that if the rank dies the merged report can say how far it got."""

    def __init__(self, info: RankInfo, steps: Callable[[], int], key: str,
                 interval_s: float = 1.0) -> None:
        self._store = JobStore(info, timeout_s=5.0)
        self._steps, self._key, self._interval = steps, key, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redline-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last = -1
        while not self._stop.wait(self._interval):
            n = self._steps()
            if n != last:
                try:
                    self._store.put(self._key, str(n).encode())
                except Exception:  # the store went away (the job ends): stop publishing
                    return
                last = n

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # the final count: exact for a rank that ends
            self._store.put(self._key, str(self._steps()).encode())
