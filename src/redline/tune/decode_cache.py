"""Where the decode-cache knob's trials keep their cache.

The cache is filled once before its trials (timed), so both sides of the comparison read a
warm pipeline, as the planned run does after its first epoch; the fill is then charged to the
planned run as compile time is (:func:`redline.tune.decide.one_off_pays`). A real run fills
the cache during its first epoch instead, at about the uncached speed plus the writes:
charging a whole separate pass errs on the side of not keeping the cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from redline.data.cache import DEFAULT_DIR


def trial_store() -> str:
    """A fresh folder for the trials' cache, beside CachedDataset's default (in /dev/shm where
    there is one: memory-backed, as the default store); removed by :func:`remove_store`."""
    parent = os.path.dirname(DEFAULT_DIR) or None
    return tempfile.mkdtemp(prefix="redline-tune-cache-", dir=parent)


def remove_store(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
