"""The LMDB calls that the cache's stores and its writer process share: opening a store for
writing, beginning a transaction, writing a batch. Nothing but ``lmdb`` is imported: the
writer process (:mod:`redline.data.cache_child`) starts with Python and this module alone.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~5 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

BATCH_BYTES = 256 * 2**10
"""Bytes of samples one transaction holds at most (a sample larger than this is a
transaction of its own).

LMDB copies a transaction's large values into pages it allocates with malloc and frees at the
commit. glibc gives memory freed at the heap's top back to the system once it passes the trim
threshold (M_TRIM_THRESHOLD, mallopt(3): 128 KiB at first, raised to twice the largest
mmapped chunk freed), so a transaction of megabytes faults all of its pages in anew each time,
and a fresh page costs more than copying 4 KiB into it. Transactions this small reuse their
pages, which also stay in the CPU's cache, and the commits this adds cost less than the faults
they save (``benchmarks/cache.py --compare-batch-bytes``; the README's cache section)."""


def open_writable(path: str, map_size: int) -> Any:
    """The environment at ``path`` opened for writing (raises ``lmdb.Error``/``OSError``)."""
    import lmdb

    # sync off: a cache needs integrity (kept by LMDB), not durability across power loss; an
    # fsync per sample would cost more than the decode it saves.
    return lmdb.open(path, map_size=map_size, subdir=True, readahead=False, max_readers=512,
                     lock=True, sync=False, metasync=False)


def begin(env: Any, **kw: Any) -> Any:
    """A transaction; where another process grew the map past this one's (a rank that read
    more free space), this one adopts its size first (``mdb_env_set_mapsize(0)``)."""
    import lmdb

    try:
        return env.begin(**kw)
    except lmdb.MapResizedError:
        env.set_mapsize(0)
        return env.begin(**kw)


def put_items(env: Any, items: list[tuple[bytes, Any]], max_bytes: int,
              ids: list[int] | None = None) -> tuple[int, int, str | None]:
    """Store the items not stored yet, one transaction for the batch: (items stored, bytes
    written, why writing stopped or None). A batch that does not fit whole is stored one item
    a transaction, so a small store is filled rather than left empty by one batch larger than
    its room; nothing is overwritten (another worker or rank may have stored a key first).
    ``ids`` gets the id of each transaction committed that stored something (LMDB numbers
    them one after the other: a transaction that stored nothing takes no number)."""
    import lmdb

    try:
        return len(items), _put(env, items, ids), None
    except lmdb.MapFullError:
        pass
    except (lmdb.Error, OSError) as e:
        return 0, 0, f"write failed ({type(e).__name__}: {e})"
    written = 0
    for stored, item in enumerate(items):
        try:
            written += _put(env, [item], ids)
        except lmdb.MapFullError:
            return stored, written, f"reached its bound of {max_bytes:,} bytes"
        except (lmdb.Error, OSError) as e:
            return stored, written, f"write failed ({type(e).__name__}: {e})"
    return len(items), written, None


def _put(env: Any, items: list[tuple[bytes, Any]], ids: list[int] | None) -> int:
    written = added = 0
    with begin(env, write=True) as txn:
        for k, v in items:
            if txn.put(k, v, overwrite=False):
                written += len(v)
                added += 1
        txn_id = txn.id()
    if ids is not None and added:
        ids.append(txn_id)
    return written
