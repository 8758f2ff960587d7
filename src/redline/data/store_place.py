"""Where the node-local sample store lives, how much of its filesystem it may take, and
cleaning up the stores a run leaves in memory.

``/dev/shm`` is memory: what a store keeps there is RAM no other process gets back until the
files are removed, and DataLoader workers hand every batch to the main process through it
(``torch.multiprocessing``'s file-descriptor sharing strategy). A store that fills it makes
those workers die ("No space left on device", a bus error), and one left behind keeps doing so
in later runs. So:

- a store takes at most :data:`SAFE_FRACTION` of its filesystem's free space (its map size is
  capped; when it is full, samples pass through uncached, as for ``max_bytes``);
- the default store goes to ``/dev/shm`` only when that fraction holds at least
  :data:`MIN_MEMORY_STORE_BYTES` (or all of ``max_bytes``), else to a folder on disk
  (:func:`disk_dir`), said once;
- a store redline makes in memory is *ephemeral*: marked as such, used under a shared lock by
  each process that opens it, and removed by the last one to leave (at its exit). One left by
  processes that died (SIGKILL, OOM) holds no lock: the next run removes it before choosing
  where to go. Stores on disk, and folders the user names, are never removed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if sys.platform != "win32":  # no /dev/shm there, so no memory store to lease
    import fcntl

SHM_DIR = "/dev/shm"
"""The memory-backed filesystem the default store prefers."""

DEFAULT_NAME = "redline-cache"
"""The default store's folder name (in SHM_DIR, or in :func:`disk_dir`)."""

SAFE_FRACTION = 0.5
"""The share of a filesystem's free space (plus what the store already holds) one store may
take: the rest stays for the DataLoader workers' shared memory and everything else."""

MIN_MEMORY_STORE_BYTES = 256 * 2**20
"""Below this budget in /dev/shm (and below ``max_bytes``), the default store goes to disk:
a store of a few MiB caches almost nothing and leaves the workers no room."""

MARKER = ".redline-ephemeral"
"""The file that marks a store redline made in memory for the processes using it."""

USERS = ".redline-users"
"""The file each process using an ephemeral store holds a shared lock on while it lives."""

FreeBytes = Callable[[str], int]


def free_bytes(path: str) -> int:
    """Bytes an unprivileged process may still write on the filesystem of ``path`` (its
    nearest existing folder)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def store_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes the files of the store at ``path`` take on disk (0 where there is none)."""
    total = 0
    with contextlib.suppress(OSError):
        for e in os.scandir(path):
            with contextlib.suppress(OSError):
                total += e.stat(follow_symlinks=False).st_blocks * 512
    return total


def budget(path: str | os.PathLike[str], max_bytes: int, free: FreeBytes | None = None) -> int:
    """The size the store at ``path`` may reach: ``max_bytes``, or SAFE_FRACTION of what its
    filesystem has free plus what the store already holds, whichever is smaller."""
    held = store_bytes(path)
    room = (free or free_bytes)(os.fspath(path)) + held
    return min(int(max_bytes), int(SAFE_FRACTION * room))


def disk_dir() -> Path:
    """The default store's folder on disk: ``$XDG_CACHE_HOME/redline`` (``~/.cache/redline``),
    or the temporary folder where that cannot be made."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "redline"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d / DEFAULT_NAME
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"{DEFAULT_NAME}-{os.getuid()}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where the default store goes and why."""

    path: Path
    """The store's folder."""
    ephemeral: bool
    """Made in memory for this run's processes: removed when the last one leaves."""
    note: str | None
    """A sentence to say once (the store went to disk), or None."""


def default_placement(max_bytes: int, *, shm: str | None = None,
                      free: FreeBytes | None = None) -> Placement:
    """Choose the default store's folder: in ``shm`` (default SHM_DIR) when its safe budget
    holds MIN_MEMORY_STORE_BYTES or all of ``max_bytes``, else on disk. Leftovers of dead
    processes in ``shm`` are removed first (their space counts as free)."""
    shm = shm if shm is not None else SHM_DIR
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        sweep(shm)
        path = Path(shm) / DEFAULT_NAME
        room = budget(path, max_bytes, free)
        if room >= min(int(max_bytes), MIN_MEMORY_STORE_BYTES):
            return Placement(path=path, ephemeral=True, note=None)
        have = (free or free_bytes)(shm)
        note = (f"{shm} has {have / 2**20:,.0f} MiB free (Docker's default is 64 MiB), and the "
                f"cache takes at most {SAFE_FRACTION:.0%} of it so DataLoader workers keep the "
                f"shared memory they pass batches through: the store is on disk, at "
                f"{disk_dir()} (give store= to choose; `docker run --shm-size` raises a container's)")
        return Placement(path=disk_dir(), ephemeral=False, note=note)
    return Placement(path=disk_dir(), ephemeral=False, note=None)


def mark_ephemeral(path: str | os.PathLike[str]) -> None:
    """Make ``path`` (a folder) a store that the last process using it removes."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    (p / MARKER).touch()


def is_ephemeral(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MARKER).is_file()


_LEASES: dict[tuple[int, str], int] = {}
"""This process's shared locks on ephemeral stores: (pid, path) → the locked file's fd."""


def lease(path: str | os.PathLike[str]) -> bool:
    """Use the ephemeral store at ``path`` from this process until it exits (a shared lock;
    forked children share it while they live). A leftover nobody holds is emptied first.
    False where the lock cannot be had (the store is then used without a lease)."""
    p = Path(path)
    key = (os.getpid(), str(p.resolve()))
    if key in _LEASES:
        return True
    for _ in range(5):
        try:
            p.mkdir(parents=True, exist_ok=True)
            fd = os.open(p / USERS, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # others use it: join them
            fcntl.flock(fd, fcntl.LOCK_SH)
        else:  # nobody uses it: what is there was left by processes that died
            _empty(p)
            fcntl.flock(fd, fcntl.LOCK_SH)
        if _still_linked(fd, p / USERS):
            (p / MARKER).touch()
            _LEASES[key] = fd
            return True
        os.close(fd)  # removed while we waited for the lock: make it again
    return False


def _still_linked(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _empty(p: Path) -> None:
    """Remove a leftover store's data (the lock and marker files stay)."""
    for e in list(p.iterdir()):
        if e.name not in (USERS, MARKER):
            with contextlib.suppress(OSError):
                shutil.rmtree(e) if e.is_dir() and not e.is_symlink() else e.unlink()


def remove_if_unused(path: str | os.PathLike[str]) -> bool:
    """Remove the ephemeral store at ``path`` if no live process holds it (True: removed)."""
    p = Path(path)
    if not is_ephemeral(p):
        return False
    try:
        fd = os.open(p / USERS, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live process uses it
        shutil.rmtree(p, ignore_errors=True)  # under the lock: a newcomer waits, then remakes
        return not p.exists()
    finally:
        os.close(fd)


def release(path: str | os.PathLike[str]) -> bool:
    """Leave the ephemeral store at ``path`` and remove it if this process was its last user
    (True: removed)."""
    p = Path(path)
    fd = _LEASES.pop((os.getpid(), str(p.resolve())), None)
    if fd is None:
        return False
    os.close(fd)
    return remove_if_unused(p)


def sweep(parent: str | os.PathLike[str]) -> list[str]:
    """Remove the ephemeral stores in ``parent`` (``redline-*`` folders) that no live process
    holds: what runs killed before their exit left. Returns their paths."""
    gone: list[str] = []
    with contextlib.suppress(OSError):
        for e in os.scandir(parent):
            if (e.name.startswith("redline-") and e.is_dir(follow_symlinks=False)
                    and (os.getpid(), str(Path(e.path).resolve())) not in _LEASES
                    and remove_if_unused(e.path)):
                gone.append(e.path)
    return gone


@atexit.register
def _release_all() -> None:
    """At this process's exit: leave its ephemeral stores, removing those nobody else uses
    (forked DataLoader workers leave through os._exit and do not run this)."""
    for pid, path in list(_LEASES):
        if pid == os.getpid():
            with contextlib.suppress(Exception):
                release(path)
