"""A cache's writes from the training process, by a writer process fed through shared memory.

A writer thread in the training process shares its interpreter lock: every batch it wakes
for, every LMDB put it makes (py-lmdb releases the lock around each one) hands the lock back
and forth with the training thread, and on a sample-by-sample fill of small samples those
hand-overs cost the training thread more than the writes themselves (``benchmarks/cache.py``;
the README's cache section). A process has no such lock. So the training process copies each
encoded sample into a ring in shared memory (an anonymous ``memfd``, mapped by both
processes), and a small process of its own (:mod:`redline.data.cache_child`: Python and
py-lmdb, no torch) writes what the ring holds into the LMDB store, a transaction a batch.

The training thread's cost per sample is one copy into the ring (for a plain tensor, one call
that checks it and copies it there, compiled where it could be built: :mod:`.cache_ring`).
Once a batch is there it publishes the ring's new end, a store into the ring's header where
the CPU keeps stores in order (:data:`ORDERED_STORES`), which the writer process reads when
it looks (every
:data:`~redline.data.cache_child.POLL_S` while records come); elsewhere, or where the writer
process sleeps long, a word on a socket, without waiting. The writer process publishes how far
it has written in the header; the training side frees those records then, and until then
serves them from memory (read your own writes, :attr:`ProcessWriter.pending`). Where the ring
has no room (a store slower than the pipeline), the training thread writes that sample itself,
so memory never grows and it never waits longer than one write.

A write that fails in the writer process (the store's bound, a full disk) is said in the
header: the writer process drops what it holds from then on and counts it as not stored, and
the dataset says why once. A writer process that cannot be started or dies is said the same
way. LMDB's transactions keep a batch that was not committed from being read.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import platform
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from redline.data import cache_child
from redline.data.cache_child import (
    ALIVE_CHECK_S,
    AWAKE,
    CONSUMED,
    DRAIN,
    ENDED_IDLE,
    EXIT,
    FAILED,
    FOREIGN,
    HEADER_BYTES,
    LOST,
    MESSAGE_AT,
    MESSAGE_LEN,
    NEXT_TXN,
    PUBLISHED,
    RECORD,
    SLEEPING,
    STATE,
    TRAINER,
    WORD,
    WRAP,
    WRITE_BATCH,
    WRITTEN,
    record_bytes,
    stopped_because,
)
from redline.data.cache_ring import Ring, new_ring, write_record
from redline.data.stores import LmdbStore, StoreFull, process_id

RING_BYTES = 32 * 2**20
"""The ring's size: what the training process may hold unwritten at most (beside its header).
A sample larger than a quarter of it is written by the training thread itself."""

WINDOW_BYTES = 2**20
"""Where records go back to the ring's beginning once the writer process has freed half of
that window there (the rest of the ring is used while it lags more): well within what a core's
cache holds. At most half the ring."""

SEND_BYTES = WINDOW_BYTES // 4
"""Bytes in the ring after which its end is published (if :data:`WRITE_BATCH` samples are not
there before): the writer process frees the window's beginning while the next records come."""

DRAIN_TIMEOUT_S = 120.0
"""How long a drain waits for the writer process before it gives up on it (said once)."""

ORDERED_STORES = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}
"""Whether the training side publishes the ring's end by a plain store in shared memory, which
the writer process reads when it looks. x86 keeps stores in program order as other cores see
them ("writes are not reordered with other writes", Intel SDM vol. 3A §9.2.2; AMD APM vol. 2
§7.2), so a record's bytes are there before the end that covers them. Elsewhere the end goes
through the socket, whose system call orders them. A store costs the training thread nothing;
a word on the socket wakes a sleeping process, and that wake-up (an inter-processor
interrupt, a VM exit in a virtual machine) is paid by the sender, once a batch."""


def _package_root(module_file: str, depth: int) -> str:
    """The folder ``depth`` levels above a module's file: where its top package lies."""
    path = os.path.abspath(module_file)
    for _ in range(depth):
        path = os.path.dirname(path)
    return path


_BOOT = ("import sys; sys.path += sys.argv[1:3]; from redline.data.cache_child import main; "
         "sys.exit(main(sys.argv[3:]))")
"""The writer process's program: isolated (-I -S: neither the working folder, nor PYTHONPATH,
nor site's start-up work), given the folders that hold redline and lmdb, after the standard
library's."""


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
"""madvise(2)'s advice that makes a range's pages, writable, in one call (Linux 5.14; the
number is Linux's, for Pythons whose mmap module predates it)."""


def _populate(mem: mmap.mmap, n: int) -> None:
    """Make the first ``n`` bytes' pages of ``mem`` now, on the fill's first sample: a
    record's first touch of a page would cost a fault each. One madvise where the kernel has
    MADV_POPULATE_WRITE: no fault, where writing zeros from a zeroed buffer takes two a page
    (a read of the buffer's, a write of the ring's); zeros written where it has not."""
    try:
        mem.madvise(MADV_POPULATE_WRITE, 0, n)
    except (OSError, ValueError, AttributeError):  # an older kernel (EINVAL), no madvise
        mem[:n] = bytes(n)


def available() -> bool:
    """Whether this system can run the writer process (Linux's ``memfd_create``)."""
    return hasattr(os, "memfd_create")


class ProcessWriter:
    """The training process's writer of one dataset to one LMDB store (see the module
    docstring); the same calls as :class:`~redline.data.cache_writer.StoreWriter`."""

    def __init__(self, store: LmdbStore, *, ring_bytes: int | None = None) -> None:
        ring_bytes = RING_BYTES if ring_bytes is None else ring_bytes
        if ring_bytes < 4096 or ring_bytes % 8:
            raise ValueError(f"ring_bytes must be a multiple of 8 of at least 4096, "
                             f"got {ring_bytes}")
        self.store = store
        self.ring_bytes = ring_bytes
        self.window = min(WINDOW_BYTES, ring_bytes // 2)
        self.ring: Ring = new_ring(ring_bytes, self.window, HEADER_BYTES, SEND_BYTES,
                                   WRITE_BATCH)
        """Where records go (its ``end``, and where the writer process had written up to,
        ``consumed``; the end last published, ``sent``), and the fill's one-call hand-over of
        a tensor (:mod:`.cache_ring`). Its ``unsettled`` keys are those of the records put
        since the last publish, in ring order (the ones before are in :attr:`_batches`): a
        record is only copied into the ring as it is submitted, and entered in
        :attr:`pending` and :attr:`_inflight` (:meth:`_settle`) only where :attr:`pending` is
        read, or where the writer process has written part of its batch (a view of a record
        must never outlive its space); a batch written whole is forgotten as it is, a loop
        over its records never run."""
        self._pending: dict[bytes, Any] = {}
        """:attr:`pending`, up to the records not settled yet."""
        self._settled = 0
        """Where the records not settled yet begin (absolute position)."""
        self._batches: collections.deque[tuple[int, list[bytes]]] = collections.deque()
        """(where it ends, its keys) of each published batch of records not settled yet, in
        ring order, from :attr:`_settled` on (the records put since are the ring's
        ``unsettled``)."""
        self.failure: str | None = None
        """Why writing stopped (None: it has not); read from the writer process's header
        once a batch."""
        self.process_ended = False
        """The writer process ended (or stopped answering and was ended) before it was told to:
        the dataset hands its writes to a writer thread from then on."""
        self._inflight: collections.deque[tuple[int, bytes]] = collections.deque()
        """(the end of its record, key) of each pending sample, in ring order."""
        self._taken = (0, 0)
        """(bytes written, samples not stored) of the writer process already counted."""
        self._own = [0, 0]
        """(bytes written, samples not stored) by this side, not counted yet."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._map: mmap.mmap | None = None
        self._head: memoryview | None = None
        self._view: memoryview = memoryview(b"")
        """The map as bytes (the pending samples are views of it)."""
        self._req: socket.socket | None = None
        """The training side's end of the socket pair that carries words to the writer process
        (a socket, not a pipe: a send to a writer process that is gone fails with EPIPE, never
        raises SIGPIPE, which a program may have set to kill it)."""
        self._ack = -1
        self._mem_fd = -1
        """The ring's memfd, kept to hand to a writer process that follows one that ended
        idle."""
        self._owner = -1
        """The process that started the writer process (a forked copy never signals it)."""
        self._alone = False
        """Set by :meth:`expect_only_own` (for this ring)."""

    # -- the training side's calls ------------------------------------------------------

    def submit(self, key: bytes, head: bytes, body: bytes | memoryview) -> None:
        """Copy one sample's stored form, ``head + body``, into the ring (readable from
        :attr:`pending` until the writer process has written it). Every read of a fill epoch
        takes this path, right after the user's transform (the CPU's caches cold): a handful
        of operations, the writer process's header read once a batch."""
        if self.failure is not None:  # the dataset stops submitting once it has said so
            self._own[1] += 1
            return
        mem = self._map
        if mem is None:  # closed (before a fork, or at exit): a later sample starts anew
            if not self.start():
                self._own[1] += 1
                return
            mem = self._map
            assert mem is not None
        ring = self.ring
        need = record_bytes(len(key), len(head) + len(body))
        end = ring.end
        at = end % self.ring_bytes
        if at + need > self.window or end + need - ring.consumed > self.ring_bytes:
            at = self._place(need)
            if self.failure is not None:  # its second look found the writer process gone
                self._own[1] += 1         # (or failing): nothing more goes into the ring
                return
            if at < 0:
                self._write_here(key, b"".join((head, body)))  # too large, or no room
                return
            end = ring.end
        write_record(mem, HEADER_BYTES + at, key, head, body)
        ring.end = end = end + need
        unsettled = ring.unsettled
        unsettled.append(key)
        if len(unsettled) >= WRITE_BATCH or end - ring.sent >= SEND_BYTES:
            self.publish()

    def publish(self) -> None:
        """Publish the ring's end to the writer process, and read its header (what
        :meth:`submit` does once a batch; the caller of ``ring.put`` where it returned 2)."""
        self._send(self.ring.end)
        self._refresh()

    @property
    def pending(self) -> dict[bytes, Any]:
        """Samples in the ring not written yet (key → a view of the stored form): read your
        own writes."""
        if self._batches or self.ring.unsettled:
            self._settle()
        return self._pending

    def _settle(self) -> None:
        """Enter every record not settled yet in :attr:`pending` and :attr:`_inflight`: each
        record's place is read back from the ring, from :attr:`_settled` on (the records are
        back to back, a wrap marker sends the next to the ring's beginning)."""
        self._seal()
        batches = self._batches
        at, size, view = self._settled, self.ring_bytes, self._view
        pending, inflight = self._pending, self._inflight
        while batches:
            for key in batches.popleft()[1]:
                k, n = RECORD.unpack_from(view, HEADER_BYTES + at % size)
                if k == WRAP:
                    at += size - at % size
                    k, n = RECORD.unpack_from(view, HEADER_BYTES)
                v0 = HEADER_BYTES + at % size + RECORD.size + k
                pending[key] = view[v0:v0 + n]
                at += record_bytes(k, n)
                inflight.append((at, key))
        self._settled = at

    def _seal(self) -> None:
        """The records put since the last publish become a batch of :attr:`_batches` (at each
        publish of the ring's end: the writer process may write them from then on)."""
        ring = self.ring
        if ring.unsettled:
            self._batches.append((ring.end, ring.unsettled))
            ring.unsettled = []

    def expect_only_own(self, last_txn: int) -> None:
        """The store's last write transaction is ``last_txn``, and the store holds none of the
        dataset's keys (:meth:`~redline.data.stores.LmdbStore.last_txn_without`): call before
        the first record. From then on, while every transaction committed to the store is
        the writer process's own (it checks their ids), a key the dataset never handed over is
        not in the store (:meth:`only_own`)."""
        head = self._head
        if head is None or self.ring.end:
            return
        head[NEXT_TXN] = last_txn + 1
        self._alone = True

    def only_own(self) -> bool:
        """Whether the store holds no key of the dataset but those handed to this writer,
        as of the writer process's last transaction (see :meth:`expect_only_own`). Another
        writer is noticed at that process's next transaction: a batch later where it keeps up
        with the training thread, later where it lags (while it starts, or behind samples
        cheaper than its writes). Until then the samples the other writer stored are computed
        again, as a snapshot's misses are (:data:`~redline.data.stores.SNAPSHOT_S`); no value
        is ever wrong. Not known once writing stopped."""
        head = self._head
        try:
            return (self._alone and head is not None and not head[FOREIGN]
                    and self.failure is None)
        except ValueError:  # the header released by a close on another thread (the fill's
            return False    # check runs without the lock)

    def drain(self) -> None:
        """Return once everything submitted so far is written (or dropped by a failure, or
        counted as not stored where the writer process ended or stopped answering for
        :data:`DRAIN_TIMEOUT_S`)."""
        if self._proc is None or self._owner != process_id():
            return  # (a forked copy: the writer process is its parent's)
        self._refresh()
        target = self.ring.end
        if self.ring.consumed >= target or self.process_ended:
            return
        self._seal()  # the drain's word publishes the end
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while self._head is not None and self._head[CONSUMED] < target:
            if self._head[STATE] == ENDED_IDLE and not self._restart():
                return
            if not self._say(target | DRAIN, deadline) or not self._wait_for(target, deadline):
                return
        self._refresh()

    def _wait_for(self, target: int, deadline: float) -> bool:
        """Wait until the writer process has written up to ``target``: True once it has, or
        once it ended idle before it read the drain's word (the caller starts the next one);
        False where it died or did not answer by ``deadline`` (then counted as lost)."""
        proc, head = self._proc, self._head
        assert proc is not None and head is not None
        acks = select.poll()  # not select(): descriptors past 1024 are common
        acks.register(self._ack, select.POLLIN)
        while head[CONSUMED] < target:
            left = deadline - time.monotonic()
            if left <= 0:
                self._lost(f"the cache's writer process wrote nothing for "
                           f"{DRAIN_TIMEOUT_S:.0f} s and was ended")
                return False
            if acks.poll(min(left, ALIVE_CHECK_S) * 1000):
                try:
                    if os.read(self._ack, 4096):
                        continue
                except OSError:
                    pass
                # The pipe's other end closed: the writer process is ending.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(ALIVE_CHECK_S)
            if proc.poll() is not None:
                if head[CONSUMED] >= target or head[STATE] == ENDED_IDLE:
                    return True
                self._lost(f"the cache's writer process ended (exit code {proc.returncode})")
                return False
        return True

    def close(self) -> None:
        """Drain, end the writer process and free the ring (a later submit starts anew). In a
        forked copy of the process that started it (a program's own fork, whose exit runs
        the finalizers it inherited), only this copy's handles are dropped."""
        self.drain()
        proc, self._proc = self._proc, None
        if proc is not None and self._owner == process_id():
            if proc.poll() is None:
                self._say(EXIT, time.monotonic() + 1.0)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._collect_counts()
        self._close_channel()
        if self._mem_fd >= 0:
            os.close(self._mem_fd)
            self._mem_fd = -1
        self._pending.clear()
        self._inflight.clear()
        ring = self.ring
        ring.release()  # (its view of the map first: a map with views open cannot close)
        ring.unsettled = []
        self._batches.clear()
        ring.end = ring.sent = ring.consumed = self._settled = 0
        head, view, mem = self._head, self._view, self._map
        self._head, self._view, self._map = None, memoryview(b""), None
        if head is not None:
            head.release()
        view.release()
        if mem is not None:
            with contextlib.suppress(BufferError):  # a view still held elsewhere: freed later
                mem.close()
        self._taken = (0, 0)  # a new writer process counts from zero
        self._alone = False

    def take_counts(self) -> tuple[int, int]:
        """(bytes written, samples not stored) since the last call."""
        self._collect_counts()
        out = (self._own[0], self._own[1])
        self._own = [0, 0]
        return out

    def start(self) -> bool:
        """Make the ring and start the writer process; False (with :attr:`failure` saying
        why) where it cannot."""
        mem_fd = -1
        try:
            if not sys.executable:
                raise OSError("sys.executable is empty: no Python to run it with")
            mem_fd = os.memfd_create("redline-cache-ring", os.MFD_CLOEXEC)
            os.ftruncate(mem_fd, HEADER_BYTES + self.ring_bytes)
            mem = mmap.mmap(mem_fd, HEADER_BYTES + self.ring_bytes)
        except Exception as e:  # no memfd, no room for it: the dataset uses a writer thread
            if mem_fd >= 0:
                os.close(mem_fd)
            self.failure = (f"the cache's writer process could not start "
                            f"({type(e).__name__}: {e})")
            return False
        _populate(mem, HEADER_BYTES + self.window)
        self._mem_fd, self._map, self._owner = mem_fd, mem, process_id()
        self._head = memoryview(mem)[:HEADER_BYTES].cast("Q")
        self._view = memoryview(mem)
        self.ring.hold(mem)
        self.failure, self.process_ended = None, False
        if self._spawn(0):
            return True
        self.close()
        return False

    def _spawn(self, start: int) -> bool:
        """Start a writer process that begins at ring position ``start``; False (with
        :attr:`failure` saying why) where it cannot."""
        socks: list[socket.socket] = []
        fds: list[int] = []
        try:
            import lmdb

            req_w, req_end = socket.socketpair()
            socks += [req_w, req_end]
            ack_r, ack_w = os.pipe()
            fds += [ack_r, ack_w]
            req_w.setblocking(False)
            cmd = [sys.executable, "-I", "-S", "-c", _BOOT, _package_root(__file__, 3),
                   _package_root(lmdb.__file__, 2), str(self._mem_fd), str(req_end.fileno()),
                   str(ack_w), str(self.ring_bytes), str(os.getpid()), str(self.store.path),
                   str(self.store.max_bytes), str(start), str(cache_child.POLL_S),
                   str(cache_child.IDLE_EXIT_S), str(cache_child.PLACE_CHECK_S)]
            # A session of its own: a Ctrl-C (SIGINT to the terminal's process group) stops the
            # training program's loop, not its cache's writes; it ends when told, once it
            # finds the training process gone (every ALIVE_CHECK_S), or idle.
            proc = subprocess.Popen(cmd, pass_fds=(self._mem_fd, req_end.fileno(), ack_w),
                                    stdin=subprocess.DEVNULL, close_fds=True,
                                    start_new_session=True)
        except Exception as e:  # no exec, no lmdb: the dataset uses a writer thread
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            for sock in socks:
                sock.close()
            self.failure = (f"the cache's writer process could not start "
                            f"({type(e).__name__}: {e})")
            return False
        os.close(ack_w)  # the writer process's end
        req_end.close()
        self._proc, self._req, self._ack = proc, req_w, ack_r
        return True

    def _restart(self) -> bool:
        """The writer process ended idle: start the next one where it stopped (nothing in the
        ring is lost: this side frees only what a writer process has written); False where
        it cannot start."""
        proc, head = self._proc, self._head
        assert head is not None
        if proc is not None:
            try:
                proc.wait(5)  # it ends right after raising the flag
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_channel()
        self._collect_counts()
        self._refresh_consumed()
        head[STATE] = AWAKE
        if not self._spawn(head[CONSUMED]):
            self._lost(self.failure or "the cache's writer process could not start again")
            return False
        if not ORDERED_STORES and self.ring.sent > head[CONSUMED]:
            self._say(self.ring.sent, None)
        return True

    def _close_channel(self) -> None:
        if self._req is not None:
            self._req.close()
        if self._ack >= 0:
            with contextlib.suppress(OSError):
                os.close(self._ack)
        self._req, self._ack = None, -1

    # -- inside -------------------------------------------------------------------------

    def _place(self, need: int) -> int:
        """Where a record of ``need`` bytes goes in the ring (its offset, after a wrap marker
        where it goes back to the beginning), or -1 where it is too large or there is no room
        (the writer process told what holds the room). Past the window it goes back to the
        ring's beginning once the writer process has freed half the window there: small
        records then cycle through pages the CPU's caches and the page tables already hold,
        not fresh ones (a first touch of a shared page costs a fault, more than the copy of a
        small sample), and a writer process that lags more has the rest of the ring."""
        size = self.ring_bytes
        if need > size // 4:
            return -1
        for fresh in (False, True):
            if fresh:
                self._refresh()  # the writer process may have freed more since last read
            end, consumed = self.ring.end, self.ring.consumed
            at = end % size
            wrap = 0
            if at + need > size:
                wrap = size - at
            elif at + need > self.window and consumed - (end - at) >= max(need,
                                                                          self.window // 2):
                wrap = size - at  # (end - at: this lap's start)
            if end + wrap + need - consumed <= size:
                if wrap:
                    assert self._map is not None
                    RECORD.pack_into(self._map, HEADER_BYTES + at, WRAP, 0)
                    self.ring.end = end + wrap
                    return 0
                return at
        if self.ring.sent < self.ring.end:
            self._send(self.ring.end)
        return -1

    def _refresh(self) -> None:
        """Read the writer process's header: forget what it has written, learn whether it
        failed; where it has written nothing since, whether it still runs (one that ended
        idle is followed by the next)."""
        head = self._head
        if head is None:
            return
        if not self._refresh_consumed() and self.ring.sent > self.ring.consumed:
            proc = self._proc
            if head[STATE] == ENDED_IDLE:
                self._restart()
                return
            if proc is not None and proc.poll() is not None:
                self._lost(f"the cache's writer process ended (exit code {proc.returncode})")
                return
        if self.failure is None and head[FAILED]:
            self.failure = self._message()

    def _refresh_consumed(self) -> bool:
        """Forget what the writer process has written since last read; whether it had."""
        head = self._head
        if head is None or head[CONSUMED] <= self.ring.consumed:
            return False
        self._release(head[CONSUMED])
        return True

    def _collect_counts(self) -> None:
        head = self._head
        if head is None:
            return
        written, lost = head[WRITTEN], head[LOST]
        self._own[0] += written - self._taken[0]
        self._own[1] += lost - self._taken[1]
        self._taken = (written, lost)

    def _release(self, consumed: int) -> None:
        """Forget the pending samples the writer process has written (read from the store from
        now on: its next miss takes a new snapshot)."""
        batches = self._batches
        while batches and batches[0][0] <= consumed:  # written whole: never settled
            self._settled = batches.popleft()[0]
        if batches and self._settled < consumed:
            self._settle()  # the writer process wrote part of a batch: views of the rest
        inflight, pending = self._inflight, self._pending
        while inflight and inflight[0][0] <= consumed:
            pending.pop(inflight.popleft()[1], None)
        self.ring.consumed = consumed
        self.store.note_written()

    def _write_here(self, key: bytes, blob: bytes) -> None:
        """Write one sample from this thread (the ring has no room for it). A store that
        refuses it stops this writer as the writer process's failure would; what the ring
        holds is still the writer process's to write or count."""
        try:
            self._own[0] += self.store.put_many([(key, blob)])
        except StoreFull as e:
            self._own[1] += 1 - e.stored
            self._own[0] += e.written
            if self.failure is None:
                self.failure = stopped_because(str(e))

    def _send(self, end: int) -> None:
        """Publish where the ring ends, without waiting: a store in the header where the CPU
        keeps stores in order (and a word on the socket only where the writer process sleeps
        long), else a word on the socket (a full socket drops it: a later one covers it)."""
        self.ring.sent = end
        self._seal()
        head = self._head
        word = end
        if head is not None:
            head[TRAINER] = threading.get_native_id()
        if ORDERED_STORES and head is not None:
            head[PUBLISHED] = end
            state = head[STATE]
            if state == ENDED_IDLE:
                self._restart()
            if state != SLEEPING:
                return
            word = 0  # only a wake-up: the end is in the header
        self._say(word, None)

    def _say(self, word: int, deadline: float | None) -> bool:
        """Send one word to the writer process; where the socket is full, wait for room until
        ``deadline`` (None: do not wait). False where the writer process is gone or did not
        take the word in time."""
        sock = self._req
        if sock is None:
            return False
        data = WORD.pack(word)
        room = None
        while True:
            try:
                sock.send(data, socket.MSG_NOSIGNAL)  # 8 bytes: taken whole or not at all
                return True
            except BlockingIOError:
                if deadline is None:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    self._lost(f"the cache's writer process took no word for "
                               f"{DRAIN_TIMEOUT_S:.0f} s and was ended")
                    return False
                if room is None:
                    room = select.poll()
                    room.register(sock.fileno(), select.POLLOUT)
                room.poll(min(left, ALIVE_CHECK_S) * 1000)
            except OSError as e:  # the writer process is gone (EPIPE)
                if self._head is not None and self._head[STATE] == ENDED_IDLE:
                    if not self._restart():
                        return False
                    sock = self._req
                    assert sock is not None
                    room = None
                    continue  # the word again, to the next one
                code = self._proc.poll() if self._proc is not None else None
                self._lost(f"the cache's writer process ended (exit code {code}; "
                           f"{type(e).__name__}: {e})")
                return False

    def _lost(self, why: str) -> None:
        """The writer process ended, or stopped answering (it is ended here, so that it never
        reads the ring again): what it wrote is counted, what the ring held unwritten is
        counted as not stored, and :attr:`process_ended` tells the dataset to go on with a
        writer thread."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        head = self._head
        if head is not None and head[CONSUMED] > self.ring.consumed:
            self._release(head[CONSUMED])
        self._settle()
        self._own[1] += len(self._inflight)
        self._release(self.ring.end)
        self.ring.release()  # nothing more is put there: a later submit counts as not stored
        self.process_ended = True
        if self.failure is None:
            self.failure = why

    def _message(self) -> str:
        head = self._head
        assert head is not None and self._map is not None
        n = min(int(head[MESSAGE_LEN]), HEADER_BYTES - MESSAGE_AT)
        text = self._map[MESSAGE_AT:MESSAGE_AT + n].decode("utf-8", "replace")
        return text or "the cache's writer process failed"
