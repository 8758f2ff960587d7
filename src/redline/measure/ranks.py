"""Which rank this process is, and the job's own c10d store to exchange summaries through.

Under ``torchrun`` (or any launcher that sets ``RANK``/``WORLD_SIZE``) each process is one rank.
redline sends nothing over a new protocol: per-rank summaries travel through the job's own
store, the TCPStore that ``torchrun``'s agent serves at ``MASTER_ADDR:MASTER_PORT`` (the one
``init_process_group`` connects to), under keys prefixed ``redline/``. Every exchange has a
bounded timeout: a rank that crashed or never reports is named, never waited for forever.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

GATHER_TIMEOUT_S = float(os.environ.get("REDLINE_GATHER_TIMEOUT_S", "120"))
"""How long rank 0 waits for the other ranks' summaries after its own run ends."""


@dataclass(frozen=True, slots=True, kw_only=True)
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

    @property
    def multi_node(self) -> bool:
        """Ranks on more than one host: their wall clocks must be aligned to be compared
        (``REDLINE_ALIGN_CLOCKS=1`` aligns them on one host too, ``0`` never)."""
        forced = os.environ.get("REDLINE_ALIGN_CLOCKS")
        if forced in ("0", "1"):
            return forced == "1" and self.distributed
        return self.world_size > self.local_world_size


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
                    host=e.get("REDLINE_HOSTNAME") or socket.gethostname(), run_id=run)


STORE_ENV = "REDLINE_STORE"
"""``host:port`` of a store redline serves itself, used instead of the job's when set: the
processes a script starts with ``torch.multiprocessing.spawn`` under ``redline doctor`` have no
launcher's store (their own, if any, lives in rank 0 and ends with its process group)."""


ENDED_GRACE_S = 1.0
"""How long a key is still waited for once its writer is known to have ended (a value sent
by a writer that did not confirm it may still reach the store)."""


class JobStore:
    """A client of the job's c10d store (see the module docstring), with bounded waits."""

    def __init__(self, info: RankInfo, timeout_s: float = 30.0) -> None:
        from torch._C._distributed_c10d import TCPStore

        host = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        own = os.environ.get(STORE_ENV)
        if own:  # redline's own store (torch.multiprocessing.spawn under doctor)
            host, _, port = own.rpartition(":")
        if host is None or port is None:
            raise RuntimeError("MASTER_ADDR / MASTER_PORT are not set: no job store to reach")
        self.info = info
        self._store: Any = TCPStore(host, int(port), is_master=False,
                                         timeout=timedelta(seconds=timeout_s),
                                         wait_for_workers=False)
        self.prefix = f"redline/{info.run_id}"

    def put(self, key: str, value: bytes) -> None:
        self._store.set(f"{self.prefix}/{key}", value)

    def put_confirmed(self, key: str, value: bytes) -> None:
        """``put``, returning once the store has applied it: the client's set only sends, and
        a process that exits right after it may leave its value in flight. One round trip on
        the same connection (which the store serves in order) confirms it."""
        self.put(key, value)
        self._store.check([f"{self.prefix}/{key}"])

    def wait_get(self, key: str, timeout_s: float) -> bytes | None:
        """The value of ``key`` once it is set, or None after ``timeout_s``."""
        full_key = f"{self.prefix}/{key}"
        try:  # blocks in the store client until the key is set (no polling delay)
            self._store.wait([full_key], timedelta(seconds=max(0.001, timeout_s)))
        except Exception:  # timed out (DistStoreError) or the store went away
            return None
        return bytes(self._store.get(full_key))

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` if it is set now (no waiting)."""
        full_key = f"{self.prefix}/{key}"
        return bytes(self._store.get(full_key)) if self._store.check([full_key]) else None

    def gather(self, keys: list[str], timeout_s: float,
               gone: Callable[[str], bool] | None = None) -> dict[str, bytes]:
        """The values of ``keys`` present within ``timeout_s`` (missing ones left out).
        ``gone(key)``: True once the key's writer is known to have ended; its key is then
        waited for :data:`ENDED_GRACE_S` more (a value it sent just before ending may still be
        on its way), not until ``timeout_s``."""
        full = {k: f"{self.prefix}/{k}" for k in keys}
        out: dict[str, bytes] = {}
        waiting = set(keys)
        deadline = time.monotonic() + timeout_s
        ended_at: dict[str, float] = {}
        while True:
            now = time.monotonic()
            for k in sorted(waiting):
                if self._store.check([full[k]]):
                    out[k] = bytes(self._store.get(full[k]))
                    waiting.discard(k)
                elif k in ended_at:
                    if now - ended_at[k] >= ENDED_GRACE_S:
                        waiting.discard(k)
                elif gone is not None and gone(k):
                    ended_at[k] = now  # a value sent just before the end may be in flight
            if not waiting or now >= deadline:
                return out
            time.sleep(0.05)


class ProgressBeacon:
    """Off the training thread, for one watch of a multi-process job: first aligns this host's
    clock to rank 0's where ranks span hosts (rank 0 answers, the others ask: see
    :func:`clock_offset`), then publishes this rank's step count every ``interval_s`` (one
    small store write), so that if the rank dies the merged report can say how far it got."""

    def __init__(self, info: RankInfo, steps: Callable[[], int], key: str,
                 interval_s: float = 1.0) -> None:
        self._store = JobStore(info, timeout_s=5.0)
        self._info, self._steps, self._key, self._interval = info, steps, key, interval_s
        self._tid = threading.get_ident()
        """The training thread (the beacon is made where the watch is entered)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redline-progress", daemon=True)
        self.clock: tuple[int, int] | None = (0, 0) if not info.multi_node or info.rank == 0 \
            else None
        """(rank 0's clock − this host's, error bound) in ns; (0, 0) on rank 0's clock; None
        while (or when) unknown."""

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # lets rank 0 stop waiting once this one is gone
            self._store.put(f"{self._key}/process{self._info.rank}", process_identity())
        with contextlib.suppress(Exception):  # alignment is best effort: unknown stays unknown
            if self._info.multi_node and self._info.rank == 0:
                serve_clock(self._store, self._key, self._info.world_size)
            elif self._info.multi_node:
                self.clock = clock_offset(self._store, self._key, self._info.rank)
        last, last_where = -1, ""
        rank = self._info.rank
        while not self._stop.wait(self._interval):
            steps_done = self._steps()
            where = code_position(self._tid)
            try:
                if steps_done != last:
                    self._store.put(f"{self._key}/progress{rank}", str(steps_done).encode())
                    self._store.put(f"{self._key}/progress_at{rank}",
                                    str(time.time_ns()).encode())
                    last = steps_done
                if where != last_where:
                    self._store.put(f"{self._key}/progress_where{rank}", where.encode())
                    last_where = where
            except Exception:  # the store went away (the job ends): stop publishing
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # the final count: exact for a rank that ends
            self._store.put(f"{self._key}/progress{self._info.rank}",
                            str(self._steps()).encode())


def process_identity() -> bytes:
    """This process as another on the same machine can look it up: host name, boot id, PID
    namespace, PID (see :func:`_machine`)."""
    return "\n".join((*_machine(), str(os.getpid()))).encode()


@functools.cache
def _machine() -> tuple[str, str, str]:
    """Host name, boot id and PID namespace of this process, read once: the boot id tells
    machines apart where host names and the initial PID namespace's inode are alike (two
    bare-metal hosts named alike, host-PID containers)."""
    parts = [socket.gethostname()]
    for path, read in (("/proc/sys/kernel/random/boot_id", _read_text),
                       ("/proc/self/ns/pid", os.readlink)):
        try:
            parts.append(read(path).strip())
        except OSError:
            parts.append("unknown")
    return parts[0], parts[1], parts[2]


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def process_ended(identity: bytes) -> bool:
    """Whether the process named by :func:`process_identity` has surely ended: only a process
    of this machine (host name, boot id) and PID namespace can be looked up; another one's is
    never called ended. A zombie (ended, not yet reaped by its launcher) has ended; a process
    hidden from this user (``/proc`` mounted with ``hidepid``) has not."""
    try:
        *where, pid_text = identity.decode().split("\n")
        pid = int(pid_text)
    except (ValueError, UnicodeDecodeError):
        return False
    if tuple(where) != _machine() or "unknown" in where or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # no signal sent: only whether the PID exists
    except ProcessLookupError:
        return True
    except OSError:  # exists, another user's
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def code_position(thread_id: int) -> str:
    """Where a thread is now: its innermost Python line, and the script's own line that led
    there when they differ (a rank blocked in a collective shows torch's frame and the
    user's line that called it)."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "unknown"
    inner = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} ({frame.f_code.co_name})"
    caller: Any = frame
    while caller is not None and _library(caller.f_code.co_filename):
        caller = caller.f_back
    if caller is None or caller is frame:
        return inner
    return (f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} ({caller.f_code.co_name}), "
            f"inside {inner}")


def _library(path: str) -> bool:
    """A frame of torch, of redline, or of Python's own library, not of the user's script."""
    return ("site-packages" in path or "/redline/" in path
            or path.startswith(("<frozen", _STDLIB)))


_STDLIB = sysconfig.get_paths()["stdlib"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankProgress:
    """How far one rank got, from its progress beacon."""

    rank: int
    steps: int | None
    """Steps it completed, as last published; None: it never published."""
    idle_s: float | None
    """Seconds since its step count last changed (to within the beacon's interval); None
    when unknown."""
    where: str | None
    """Where its training thread was at the last beacon (see :func:`code_position`)."""


def read_progress(store: JobStore, key: str, world_size: int) -> list[RankProgress]:
    """Every rank's progress as its beacon last published it."""
    now = time.time_ns()
    out = []
    for rank in range(world_size):
        steps, published_at, where = (store.peek(f"{key}/{k}{rank}")
                            for k in ("progress", "progress_at", "progress_where"))
        out.append(RankProgress(rank=rank, steps=int(steps) if steps else None,
                                idle_s=(now - int(published_at)) / 1e9 if published_at else None,
                                where=where.decode(errors="replace") if where else None))
    return out


def stalled(progress: list[RankProgress]) -> list[int]:
    """The ranks the others wait for: those with the fewest steps when counts differ, else
    those outside torch (in the script's own code) while the others are inside it (blocked in
    a collective, a backward that reduces); [] when no rank stands out."""
    known = [beacon for beacon in progress if beacon.steps is not None]
    if not known:
        return []
    least = min(beacon.steps for beacon in known if beacon.steps is not None)
    behind = [beacon.rank for beacon in known if beacon.steps == least]
    if len(behind) < len(known):
        return behind
    outside = [beacon.rank for beacon in known if beacon.where and ", inside " not in beacon.where]
    return outside if 0 < len(outside) < len(known) else []


def progress_line(progress: list[RankProgress]) -> str:
    """The ranks' progress in one sentence, the stuck one(s) named."""
    parts = [f"rank {beacon.rank}: " + ("no step published" if beacon.steps is None else
                                        f"{beacon.steps} step(s), last progress "
                                        + ("unknown" if beacon.idle_s is None
                                           else f"{beacon.idle_s:.1f} s ago"))
             + (f", at {beacon.where}" if beacon.where else "") for beacon in progress]
    stuck = stalled(progress)
    verdict = (f"rank(s) {', '.join(map(str, stuck))} stopped progressing (the others wait for "
               "them)" if stuck else "no rank stands out")
    return f"{verdict}; " + "; ".join(parts)


CLOCK_ROUNDS = 8
"""Round trips per rank; the one with the shortest round trip gives the offset (its error
bound is half that round trip, as in NTP's clock filter: Mills, RFC 5905 §10)."""


def serve_clock(store: JobStore, key: str, world_size: int, timeout_s: float = 60.0) -> None:
    """Rank 0: answer every other rank's clock requests with this host's wall clock."""
    deadline = time.monotonic() + timeout_s
    for rank in range(1, world_size):
        for i in range(CLOCK_ROUNDS):
            left = deadline - time.monotonic()
            if left <= 0 or store.wait_get(f"{key}/clock/req{rank}.{i}", left) is None:
                break  # this rank does not ask (or no longer): the next one may
            store.put(f"{key}/clock/resp{rank}.{i}", str(time.time_ns()).encode())


def clock_offset(store: JobStore, key: str, rank: int,
                 timeout_s: float = 60.0) -> tuple[int, int] | None:
    """(rank 0's clock − this host's clock, error bound), both ns, from round trips through
    the store that rank 0 answers (:func:`serve_clock`); None if it does not answer."""
    best: tuple[int, int] | None = None
    for i in range(CLOCK_ROUNDS):
        sent_ns = time.time_ns()
        store.put(f"{key}/clock/req{rank}.{i}", b"?")
        got = store.wait_get(f"{key}/clock/resp{rank}.{i}", timeout_s)
        received_ns = time.time_ns()
        if got is None:
            break
        err = (received_ns - sent_ns) // 2
        offset = int(got) - (sent_ns + received_ns) // 2
        if best is None or err < best[1]:
            best = (offset, err)
    return best
