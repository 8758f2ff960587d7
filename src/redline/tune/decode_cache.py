"""Where the decode-cache knob's trials keep their cache.

The cache is filled once before its trials (timed), so both sides of the comparison read a
warm pipeline, as the planned run does after its first epoch; the fill is then charged to the
planned run as compile time is (:func:`redline.tune.decide.one_off_pays`). A real run fills
the cache during its first epoch instead, at about the uncached speed plus the writes:
charging a whole separate pass errs on the side of not keeping the cache.
"""

from __future__ import annotations

import shutil
import tempfile

from redline.data import store_place


def trial_store() -> str:
    """A fresh folder for the trials' cache, where CachedDataset's default would go (in
    /dev/shm where it has room: memory-backed, as the default store; else on disk); removed by
    :func:`remove_store`, or, in memory, by the next run if this one is killed first."""
    place = store_place.default_placement(8 * 2**30)
    parent = place.path.parent
    parent.mkdir(parents=True, exist_ok=True)
    path = tempfile.mkdtemp(prefix="redline-tune-cache-", dir=parent)
    if place.ephemeral:
        store_place.mark_ephemeral(path)
    return path


def remove_store(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
