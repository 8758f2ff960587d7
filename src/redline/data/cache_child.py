"""The cache's writer process (:mod:`redline.data.cache_proc` starts it: ``python -m
redline.data.cache_child``), and the layout of the ring it shares with the training process.

It imports nothing heavier than ``lmdb`` (no torch, no redline module beyond
:mod:`redline.data.lmdb_env`): it starts while the training process's first epoch runs, on
the cores that epoch uses, so its start-up is kept to what Python itself costs.

The ring: a header of :data:`HEADER_BYTES`, then records at 8-byte aligned absolute positions
(the offset is the position modulo the ring's size): key length and value length (two
little-endian u32), the key, the value, padding to 8 bytes. A key length of :data:`WRAP` says
the rest of the ring is unused and the next record starts at its beginning.
"""

from __future__ import annotations

import mmap
import os
import select
import struct
import sys
import time

from redline.data import lmdb_env

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~5 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

HEADER_BYTES = 4096
"""The header before the ring: the writer process's counters and its failure message."""

CONSUMED, WRITTEN, LOST, FAILED, MESSAGE_LEN = 0, 1, 2, 3, 4
"""u64 fields of the header the writer process writes (one cache line): ring position written
up to, bytes written, samples not stored, 1 once writing failed, the failure message's
length."""

PUBLISHED = 8
"""u64 field (a cache line of its own) the training side writes: where the ring ends (where
the CPU keeps stores in order: :data:`redline.data.cache_proc.ORDERED_STORES`)."""

STATE = 16
"""u64 field (a cache line of its own) the writer process writes: :data:`AWAKE`,
:data:`SLEEPING` or :data:`ENDED_IDLE`."""

AWAKE, SLEEPING, ENDED_IDLE = 0, 1, 2
"""The writer process looks at the ring every :data:`POLL_S`; it sleeps long
(:data:`IDLE_POLL_S`: the training side wakes it with a word on the socket); it ended after
:data:`IDLE_EXIT_S` with nothing to write (the training side starts another, which goes on
where it stopped)."""

TRAINER = 24
"""u64 field (a cache line of its own) the training side writes: the thread id of the thread
that publishes the ring's end (the training thread), whose CPU the writer process keeps off
(:class:`_KeepOff`)."""

NEXT_TXN = 40
"""u64 field (a cache line of its own): the id the writer process's next LMDB write
transaction has where nobody else writes to the store (LMDB numbers them one after the other);
0 where it is not known. The training side sets it before its first record, where the store
held none of the dataset's keys
(:meth:`redline.data.cache_proc.ProcessWriter.expect_only_own`)."""

FOREIGN = 48
"""u64 field (a cache line of its own: the training side reads it every sample) the writer
process sets to 1 once a transaction of its own did not follow the last one known (another
process, or the training thread itself, wrote between), or found a key it was given already
stored (another writer stored it, whatever the order of the transactions): from then on the
training side looks every sample up in the store again."""

MESSAGE_AT = 512
"""Where the failure message (UTF-8) begins in the header."""

RECORD = struct.Struct("<II")
WRAP = 0xFFFFFFFF
"""A record's key length that says: go on at the ring's beginning."""


def record_bytes(k: int, n: int) -> int:
    """A record's room in the ring: its header (:data:`RECORD`), a key of ``k`` bytes and
    ``n`` bytes of value, padded to 8."""
    return (RECORD.size + k + n + 7) & ~7

WORD = struct.Struct("<Q")
"""What the socket carries: the ring's end, with :data:`DRAIN` set or not, or :data:`EXIT`."""
DRAIN = 1 << 63
"""Set in a word: answer on the acknowledgement pipe once the ring is written up to it."""
EXIT = (1 << 64) - 1
"""The word that ends the writer process (after it wrote what the ring holds)."""

WRITE_BATCH = 32
"""Samples a transaction at most (the training side publishes the ring's end at least once
that many are there)."""

ALIVE_CHECK_S = 1.0
"""How often the writer process looks whether the training process still lives."""

POLL_S = 0.001
"""How often the writer process looks at the ring's end while records come."""

IDLE_POLLS = 200
"""Looks that found nothing new after which the writer process sleeps long."""

IDLE_POLL_S = 0.05
"""How long it sleeps then, unless woken (a word on the socket)."""

PLACE_CHECK_S = 0.01
"""How often, while records come, the writer process looks which CPU the training thread is
on (:class:`_KeepOff`; infinite: never, the kernel places it)."""

IDLE_EXIT_S = 5.0
"""How long the writer process waits with nothing to write before it ends (a fill is over:
no process is kept for a dataset that reads from its store)."""

NICE_STEP = 10
"""How much nicer than the training process the writer process runs once started: nice +10
weighs about a tenth of a training thread (the kernel's nice-to-weight table: 110 against
1024), so on busy cores it takes little from the training work, and the ring lets it fall
behind for a while (:data:`redline.data.cache_writer.NICE_STEP` says the same of the writer
thread)."""


class _Ring:
    """The writer process's side of the ring: the map, the store and where it has written."""

    def __init__(self, mem: mmap.mmap, ring_bytes: int, env: Any, max_bytes: int,
                 start: int) -> None:
        self.head = memoryview(mem)[:HEADER_BYTES].cast("Q")
        self.data = memoryview(mem)[HEADER_BYTES:]
        self.ring_bytes = ring_bytes
        self.env = env
        self.max_bytes = max_bytes
        self.consumed = start
        """Where it has written up to (a writer process that follows one that ended idle
        starts where that one stopped)."""

    def write_up_to(self, end: int) -> None:
        """Write the records up to ``end``, a transaction a batch; publish each batch's counts,
        then how far it has written (the training side frees up to there)."""
        head = self.head
        while self.consumed < end:
            at, items = self._batch(end)
            if items and head[FAILED]:
                head[LOST] += len(items)
            elif items:
                ids: list[int] = []
                stored, written, why = lmdb_env.put_items(self.env, items, self.max_bytes, ids)
                for txn_id in ids:
                    if head[NEXT_TXN] and txn_id != head[NEXT_TXN]:
                        head[FOREIGN] = 1  # another transaction came between
                    head[NEXT_TXN] = txn_id + 1
                if why is None and written != sum(len(v) for _, v in items):
                    head[FOREIGN] = 1  # a key was there already: another writer stored it
                head[WRITTEN] += written
                if why is not None:
                    head[LOST] += len(items) - stored
                    say_failed(head, stopped_because(why))
            head[CONSUMED] = self.consumed = at

    def _batch(self, end: int) -> tuple[int, list[tuple[bytes, memoryview]]]:
        """The records from where it has written up to ``end``, a batch at most: (where the
        next one begins, (key, value) of each)."""
        at, size, ring, data = self.consumed, 0, self.ring_bytes, self.data
        items: list[tuple[bytes, memoryview]] = []
        while at < end and len(items) < WRITE_BATCH:
            off = at % ring
            klen, vlen = RECORD.unpack_from(data, off)
            if klen == WRAP:
                at += ring - off
                continue
            if items and size + vlen > lmdb_env.BATCH_BYTES:
                break  # the next transaction's
            k0 = off + RECORD.size
            items.append((bytes(data[k0:k0 + klen]), data[k0 + klen:k0 + klen + vlen]))
            size += vlen
            at += record_bytes(klen, vlen)
        return at, items


class _KeepOff:
    """Keeps the writer process off the CPU the training thread last ran on.

    The training thread is the fill's critical path; the other cores run the user's intra-op
    threads (which wait between parallel regions, spinning) or nothing. Left to the
    scheduler, the writer process stays on whichever CPU it first ran on; where that is the
    training thread's, each of its time slices delays the epoch by as much, and a fill read
    one by one swings between rounds near the uncached epoch's time and rounds a tenth or
    more above it (``benchmarks/cache.py --compare-placement``; the README's cache section
    has the numbers). So it moves itself to the CPUs it may use but that one, where it may use
    two or more; the training thread's CPU is read from ``/proc/<pid>/task/<tid>/stat``."""

    def __init__(self, parent: int, head: memoryview) -> None:
        self.parent, self.head = parent, head
        try:
            self.cpus = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # no affinity calls here: the kernel places it
            self.cpus = frozenset()
        self.avoid = -1
        """The CPU kept off now (-1: none)."""

    def check(self) -> None:
        if len(self.cpus) < 2:
            return
        tid = self.head[TRAINER]
        cpu = _cpu_of(self.parent, tid) if tid else None
        if cpu is None or cpu == self.avoid:
            return
        try:
            os.sched_setaffinity(0, self.cpus - {cpu} if cpu in self.cpus else self.cpus)
        except OSError:  # not allowed here: the kernel places it
            self.cpus = frozenset()
        self.avoid = cpu


def _cpu_of(pid: int, tid: int) -> int | None:
    """The CPU thread ``tid`` of process ``pid`` last ran on (field 39 of its ``stat``,
    proc(5); the fields after the command's closing parenthesis start at field 3), or None."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        return int(raw[raw.rindex(b")") + 2:].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def stopped_because(why: str) -> str:
    """The sentence a dataset says once when its store stops taking samples."""
    if why.startswith("write failed"):
        return why
    return f"{why} (fill-once policy: nothing is evicted)"


def serve(ring: _Ring, req: int, ack: int, parent: int,
          timing: tuple[float, float, float]) -> None:
    """Write what the training process puts in the ring, until it says :data:`EXIT`, closes
    its end of the socket, or is gone (then what it had published is written first)."""
    head = ring.head
    poll_s, idle_exit_s, place_check_s = timing
    poller = select.poll()  # not select(): descriptors past 1024 are common in training jobs
    poller.register(req, select.POLLIN)
    published = ring.consumed
    drains: list[int] = []
    leftover = b""
    ending = False
    idle = 0
    alive_checked = idle_since = time.monotonic()
    keep_off = _KeepOff(parent, head)
    placed = 0.0
    while not ending:
        timeout_ms = poll_s * 1000
        if idle >= IDLE_POLLS:
            if time.monotonic() - idle_since >= idle_exit_s and not drains:
                # Ends for good once the flag is up (the training side may read it at once
                # and start the next writer process): what it publishes from here on is
                # that one's to write.
                head[STATE] = ENDED_IDLE
                return
            head[STATE] = SLEEPING
            if head[PUBLISHED] <= published:  # nothing came while the flag went up
                timeout_ms = min(IDLE_POLL_S, ALIVE_CHECK_S) * 1000
        ready = poller.poll(timeout_ms)
        head[STATE] = AWAKE
        if ready:
            chunk = os.read(req, 65536)
            if not chunk:
                ending = True  # the training side closed its end
            data = leftover + chunk
            whole = len(data) - len(data) % 8
            leftover = data[whole:]
            for (word,) in WORD.iter_unpack(data[:whole]):
                if word == EXIT:
                    ending = True
                    continue
                pos = word & ~DRAIN
                published = max(published, pos)
                if word & DRAIN:
                    drains.append(pos)
        now = time.monotonic()
        if now - alive_checked >= ALIVE_CHECK_S:
            alive_checked = now
            if os.getppid() != parent:  # the training process is gone: write what it sent
                ending = True
        published = max(published, head[PUBLISHED])
        if ring.consumed < published:
            idle, idle_since = 0, now
            if now - placed >= place_check_s:
                placed = now
                keep_off.check()
        else:
            idle += 1
        ring.write_up_to(published)
        if drains and ring.consumed >= max(drains):
            drains.clear()
            try:  # noqa: SIM105 (contextlib: ~3 ms more at start-up)
                os.write(ack, b"\1")
            except OSError:  # the training side is gone: nobody waits
                pass


def say_failed(head: memoryview, why: str) -> None:
    """Put ``why`` in the header, then raise the flag the training side reads first."""
    text = why.encode()[:HEADER_BYTES - MESSAGE_AT]
    head.cast("B")[MESSAGE_AT:MESSAGE_AT + len(text)] = text
    head[MESSAGE_LEN] = len(text)
    head[FAILED] = 1


def main(argv: list[str]) -> int:
    """``mem_fd req_fd ack_fd ring_bytes parent_pid path max_bytes start poll_s idle_exit_s
    place_check_s``: the descriptors are the ring's memfd, this side of the socket and the
    write end of the acknowledgement pipe; ``start`` is where in the ring to begin; the last
    three are :data:`POLL_S`, :data:`IDLE_EXIT_S` and :data:`PLACE_CHECK_S` as the training
    side has them."""
    mem_fd, req, ack, ring_bytes, parent = (int(x) for x in argv[:5])
    path, max_bytes, start = argv[5], int(argv[6]), int(argv[7])
    timing = (float(argv[8]), float(argv[9]), float(argv[10]))
    mem = mmap.mmap(mem_fd, HEADER_BYTES + ring_bytes)
    os.close(mem_fd)
    try:
        # The training process sized the map (max_bytes is its budget already) and made the
        # folder; its own store holds the lease on an ephemeral one while it lives.
        env = lmdb_env.open_writable(path, max_bytes)
    except Exception as e:
        env = None
        say_failed(memoryview(mem)[:HEADER_BYTES].cast("Q"),
                   f"write failed (the cache's writer process could not open the store: "
                   f"{type(e).__name__}: {e})")
    # Started at the training process's priority, so that it gets going at once; from here
    # on it yields the cores to the training work.
    try:  # noqa: SIM105 (contextlib: ~3 ms more at start-up)
        os.nice(NICE_STEP)
    except OSError:
        pass
    try:
        serve(_Ring(mem, ring_bytes, env, max_bytes, start), req, ack, parent, timing)
    finally:
        if env is not None:
            env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
