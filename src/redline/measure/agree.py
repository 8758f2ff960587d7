"""Ranks that decide alike: every rank's value gathered through the job's store, merged by one
function on every rank.

A tuning search under ``torchrun`` must take the same path on every rank: each trial runs the
user's training step, whose collectives hang if one rank runs a trial another skips. Timing
is per rank (each rank's clock, data shard and CPUs differ), so each decision point gathers
every rank's measurement (in rank order) and merges them with the same function: identical
inputs, identical code, identical decisions — rank 0's view is everybody's, with no extra
broadcast. A trial that fails on one rank fails on all of them, with that rank's error.

Values travel pickled through the job's c10d store (see :mod:`redline.measure.ranks`), under
keys numbered by the order of the agreement points: ranks run the same code, so the n-th point
of one rank is the n-th of another; a label carried with each value checks it. In a single
process every call returns its own value at once.
"""

from __future__ import annotations

import itertools
import os
import pickle
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redline.core.errors import RedlineError
from redline.measure.ranks import JobStore, RankInfo, rank_info

T = TypeVar("T")

AGREE_TIMEOUT_S = float(os.environ.get("REDLINE_AGREE_TIMEOUT_S", "1800"))
"""How long a rank waits for the others at one agreement point: trials of a large model take
minutes; a rank that crashed makes torchrun stop the others long before this."""

FAIL_WAIT_S = float(os.environ.get("REDLINE_AGREE_FAIL_WAIT_S", "60"))
"""How long a rank whose step failed waits for the others to report theirs. Where they failed
too (a knob that cannot run anywhere) all go on alike; where they did not, they are blocked in
a collective that needs this rank, so it stops, and the launcher stops them."""

_AGREEMENTS = itertools.count()


class RanksDivergedError(RedlineError, RuntimeError):
    """The ranks did not reach the same agreement point: one timed out, crashed or ran other
    code."""


class NoJobStoreError(RedlineError, RuntimeError):
    """A process that is one rank of many (``WORLD_SIZE`` > 1) cannot reach its job's store."""


class RankFailedError(RedlineError, RuntimeError):
    """Another rank's step failed with an error that could not be sent as itself."""


class Agreement:
    """Gather-and-merge across the job's ranks (one process: identity)."""

    def __init__(self, info: RankInfo | None = None, store: JobStore | None = None,
                 timeout_s: float = AGREE_TIMEOUT_S) -> None:
        self.info = info or RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, host="",
                                     run_id="local")
        if self.info.distributed and store is None:
            store = JobStore(self.info, timeout_s=60.0)
        self.store = store
        self.timeout_s = timeout_s
        self.name = f"agree{next(_AGREEMENTS)}"
        self.points = 0
        """Agreement points passed so far."""

    @classmethod
    def for_job(cls) -> Agreement:
        """The agreement of this process's job (``RANK``/``WORLD_SIZE`` from the launcher)."""
        info = rank_info()
        if not info.distributed:
            return cls()
        try:
            return cls(info)
        except Exception as e:
            raise NoJobStoreError(
                f"this process is rank {info.rank} of {info.world_size} (WORLD_SIZE is set) but "
                f"cannot reach the job's store ({type(e).__name__}: {e}). Ranks tune in step "
                "through the store torchrun serves at MASTER_ADDR:MASTER_PORT: launch with "
                "`torchrun --nproc_per_node=N --no-python redline tune script.py`, or unset "
                "WORLD_SIZE to tune one process.") from None

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def gather(self, value: T, what: str, timeout_s: float | None = None) -> list[T]:
        """Every rank's ``value``, in rank order. ``what`` names the point (in errors, and to
        check that every rank is at the same one)."""
        if self.store is None:
            return [value]
        wait = self.timeout_s if timeout_s is None else timeout_s
        seq = self.points
        self.points += 1
        base = f"{self.name}/{seq}"
        self.store.put(f"{base}/{self.rank}", pickle.dumps((what, value)))
        keys = [f"{base}/{rank}" for rank in range(self.world_size)]
        start_s = time.monotonic()
        # Blocking waits in the store client (no polling delay at every agreement point).
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + wait
        for k in keys:
            received = self.store.wait_get(k, max(0.0, deadline - time.monotonic()))
            if received is not None:
                got[k] = received
        missing = [rank for rank in range(self.world_size) if f"{base}/{rank}" not in got]
        if missing:
            raise RanksDivergedError(
                f"rank {self.rank} waited {time.monotonic() - start_s:,.0f} s at {what!r} (agreement "
                f"point {seq}) for rank(s) {missing}, which never arrived: they crashed, hang "
                "in a collective, or run other code. The job cannot go on; see the other "
                "ranks' output (REDLINE_AGREE_TIMEOUT_S sets the wait).")
        out: list[T] = []
        for rank in range(self.world_size):
            their_what, received = pickle.loads(got[f"{base}/{rank}"])
            if their_what != what:
                raise RanksDivergedError(
                    f"the ranks took different paths: rank {self.rank} is at {what!r}, rank {rank} "
                    f"at {their_what!r} (agreement point {seq}); a setup factory that builds "
                    "different models or loaders per rank cannot be tuned as one job")
            out.append(received)
        return out

    def merge(self, value: T, what: str, fn: Callable[[list[T]], T]) -> T:
        return fn(self.gather(value, what))

    def max(self, value: float, what: str) -> float:
        return max(self.gather(value, what))

    def min(self, value: float, what: str) -> float:
        return min(self.gather(value, what))

    def all(self, flag: bool, what: str) -> bool:
        return all(self.gather(flag, what))

    def first(self, value: T, what: str) -> T:
        """Rank 0's ``value`` on every rank."""
        return self.gather(value, what)[0]

    def run(self, fn: Callable[[], T], what: str) -> list[T]:
        """Run ``fn`` here and return every rank's result; if it raised on any rank, raise on
        every rank: this rank's own exception where it failed here, else the first failing
        rank's (with a note naming it)."""
        try:
            mine: tuple[bool, Any] = (True, fn())
        except Exception as e:
            if self.store is None:
                raise
            own: Exception | None = e
            mine = (False, _portable(e))
        else:
            own = None
        if own is None:
            outcomes = self.gather(mine, what)
        else:
            try:
                outcomes = self.gather(mine, what, timeout_s=FAIL_WAIT_S)
            except RanksDivergedError as e:
                raise RanksDivergedError(
                    f"{what!r} failed on rank {self.rank} ({type(own).__name__}: {own}) and not "
                    f"on every other rank: {e}") from own
            raise own
        for rank, (succeeded, result) in enumerate(outcomes):
            if not succeeded:
                err = _restore(result, rank)
                err.add_note(f"raised on rank {rank} at {what!r}; every rank stops this step")
                raise err
        return [result for _, result in outcomes]


def _portable(e: Exception) -> bytes | str:
    """The exception pickled, or its type and message where it does not pickle."""
    try:
        blob = pickle.dumps(e)
        pickle.loads(blob)
        return blob
    except Exception:
        return f"{type(e).__name__}: {e}"


def _restore(v: bytes | str, rank: int) -> Exception:
    if isinstance(v, str):
        return RankFailedError(f"rank {rank} failed: {v}")
    err = pickle.loads(v)
    return err if isinstance(err, Exception) else RankFailedError(f"rank {rank} failed")
