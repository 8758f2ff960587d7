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

ASLEEP = 16
"""u64 field (a cache line of its own) the writer process writes: 1 while it sleeps long
(:data:`IDLE_POLL_S`), so the training side wakes it with a word on the socket."""

MESSAGE_AT = 256
"""Where the failure message (UTF-8) begins in the header."""

RECORD = struct.Struct("<II")
WRAP = 0xFFFFFFFF
"""A record's key length that says: go on at the ring's beginning."""

WORD = struct.Struct("<Q")
"""What the socket carries: the ring's end, with :data:`DRAIN` set or not, or :data:`EXIT`."""
DRAIN = 1 << 63
"""Set in a word: answer on the acknowledgement pipe once the ring is written up to it."""
EXIT = (1 << 64) - 1
"""The word that ends the writer process (after it wrote what the ring holds)."""

WRITE_BATCH = 32
"""Samples a transaction at most (the training side publishes the ring's end at least once
that many are there)."""

BATCH_BYTES = 8 * 2**20
"""Bytes a transaction at most."""

ALIVE_CHECK_S = 1.0
"""How often the writer process looks whether the training process still lives."""

POLL_S = 0.001
"""How often the writer process looks at the ring's end while records come."""

IDLE_POLLS = 200
"""Looks that found nothing new after which the writer process sleeps long."""

IDLE_POLL_S = 0.05
"""How long it sleeps then, unless woken (a word on the socket)."""

NICE_STEP = 10
"""How much nicer than the training process the writer process runs once started: nice +10
weighs about a tenth of a training thread (the kernel's nice-to-weight table: 110 against
1024), so on busy cores it takes little from the training work, and the ring lets it fall
behind for a while (:data:`redline.data.cache_writer.NICE_STEP` says the same of the writer
thread)."""


def serve(mem: mmap.mmap, req: int, ack: int, ring_bytes: int, parent: int, env: Any,
          max_bytes: int) -> None:
    """Write what the training process puts in the ring, until it says :data:`EXIT`, closes
    its end of the socket, or is gone."""
    head = memoryview(mem)[:HEADER_BYTES].cast("Q")
    ring = memoryview(mem)[HEADER_BYTES:]
    consumed = published = 0
    drains: list[int] = []
    leftover = b""
    ending = False
    idle = 0
    alive_checked = time.monotonic()
    while not ending:
        timeout = POLL_S
        if idle >= IDLE_POLLS:
            head[ASLEEP] = 1
            if head[PUBLISHED] == published:  # nothing came while the flag went up
                timeout = min(IDLE_POLL_S, ALIVE_CHECK_S)
        ready, _, _ = select.select([req], [], [], timeout)
        head[ASLEEP] = 0
        if ready:
            data = leftover + os.read(req, 65536)
            if not data:
                ending = True  # every write end closed
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
        idle = 0 if consumed < published else idle + 1
        while consumed < published:
            consumed = _write_batch(head, ring, ring_bytes, consumed, published, env, max_bytes)
            head[CONSUMED] = consumed
        if drains and consumed >= max(drains):
            drains.clear()
            try:  # noqa: SIM105 (contextlib: ~3 ms more at start-up)
                os.write(ack, b"\1")
            except OSError:  # the training side is gone: nobody waits
                pass


def _write_batch(head: memoryview, ring: memoryview, ring_bytes: int, at: int, end: int,
                 env: Any, max_bytes: int) -> int:
    """Write the records from ``at`` (up to ``end``, at most a batch) in one transaction;
    returns where the next record begins."""
    items: list[tuple[bytes, memoryview]] = []
    size = 0
    while at < end and len(items) < WRITE_BATCH and size < BATCH_BYTES:
        off = at % ring_bytes
        klen, vlen = RECORD.unpack_from(ring, off)
        if klen == WRAP:
            at += ring_bytes - off
            continue
        k0 = off + RECORD.size
        items.append((bytes(ring[k0:k0 + klen]), ring[k0 + klen:k0 + klen + vlen]))
        size += vlen
        at += (RECORD.size + klen + vlen + 7) & ~7
    if not items:
        return at
    if head[FAILED]:
        head[LOST] += len(items)
        return at
    stored, written, why = lmdb_env.put_items(env, items, max_bytes)
    head[WRITTEN] += written
    if why is not None:
        head[LOST] += len(items) - stored
        say_failed(head, why if why.startswith("write failed")
                   else f"{why} (fill-once policy: nothing is evicted)")
    return at


def say_failed(head: memoryview, why: str) -> None:
    """Put ``why`` in the header, then raise the flag the training side reads first."""
    text = why.encode()[:HEADER_BYTES - MESSAGE_AT]
    head.cast("B")[MESSAGE_AT:MESSAGE_AT + len(text)] = text
    head[MESSAGE_LEN] = len(text)
    head[FAILED] = 1


def main(argv: list[str]) -> int:
    """``mem_fd req_fd ack_fd ring_bytes parent_pid path max_bytes``: the descriptors are the
    ring's memfd, this side of the socket and the write end of the acknowledgement pipe."""
    mem_fd, req, ack, ring_bytes, parent = (int(x) for x in argv[:5])
    path, max_bytes = argv[5], int(argv[6])
    mem = mmap.mmap(mem_fd, HEADER_BYTES + ring_bytes)
    os.close(mem_fd)
    head = memoryview(mem)[:HEADER_BYTES].cast("Q")
    try:
        # The training process sized the map (max_bytes is its budget already) and made the
        # folder; its own store holds the lease on an ephemeral one while it lives.
        env = lmdb_env.open_writable(path, max_bytes)
    except Exception as e:
        say_failed(head, f"the cache's writer process could not open the store "
                         f"({type(e).__name__}: {e})")
        env = None
    # Started at the training process's priority, so that it gets going at once; from here
    # on it yields the cores to the training work.
    try:  # noqa: SIM105 (contextlib: ~3 ms more at start-up)
        os.nice(NICE_STEP)
    except OSError:
        pass
    try:
        serve(mem, req, ack, ring_bytes, parent, env, max_bytes)
    finally:
        if env is not None:
            env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
