"""Atomic file writes: a crash or a full disk leaves the old file or the whole new one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(text: str, path: str | os.PathLike[str]) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    Raises:
        OSError: with the path in the message when the folder is missing or not writable, or
            the disk is full; the destination is then left untouched and no temporary file
            remains.
    """
    dest = Path(path)
    directory = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {dest}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {dest}: {e.strerror}") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
