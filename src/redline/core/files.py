"""Files redline writes: atomically, with the user's permissions, and never over an input.

An output is written through a temporary file in the same folder and a rename, so a crash or a
full disk leaves the old file or the whole new one. It gets the permissions a file made by the
user would get (the mode of the file it replaces, else 0666 less the umask). And every command
refuses, before it does any work, an output path that is one of its inputs or the script it
runs (:func:`refuse_overwriting_inputs`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from redline.core.errors import RedlineError


class OutputPathError(RedlineError, ValueError):
    """An output path that would replace one of the command's inputs, or could not be written
    (a directory, a missing or read-only folder)."""


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (/proc), else by the
    classic set-and-restore."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` could not be written later ("directory 'x' does not exist" / "... is not
    writable"), or None: checked before a long run, so it fails at once and not at its end."""
    parent = Path(path).parent if str(Path(path).parent) else Path(".")
    if not parent.is_dir():
        return f"directory {str(parent)!r} does not exist"
    if not os.access(parent, os.W_OK):
        return f"directory {str(parent)!r} is not writable"
    return None


_EXAMPLE_NAMES = {"html": "report.html", "plan": "redline-plan.json",
                  "timeline": "timeline.json"}
"""A file name to suggest inside a directory given as an output, by option."""


def output_problem(flag: str, path: str | os.PathLike[str]) -> str | None:
    """Why the output ``flag PATH`` could not be written at the end of a run, with what to do,
    or None. Checked before any work, so that a long run never ends in a report it cannot
    write: ``path`` is an existing directory, or its folder is missing, not a folder, or not
    writable."""
    p = Path(path)
    if p.is_dir():
        example = p / _EXAMPLE_NAMES.get(flag.strip("-`").replace("_path", ""), "report.json")
        return (f"{flag} {str(path)!r} is an existing directory; give the path of a file, "
                f"e.g. {str(example)!r}")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        return (f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a directory; give a "
                "path in an existing directory")
    problem = folder_problem(path)
    if problem is not None:
        return f"{flag} {str(path)!r}: {problem}; create it or give another path"
    return None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: after symlinks, and for hard links too."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def refuse_overwriting_inputs(outputs: Mapping[str, str | os.PathLike[str] | None],
                              inputs: Mapping[str, Iterable[str | os.PathLike[str]]]) -> None:
    """Raise :class:`OutputPathError` when an output resolves to an input or two outputs to one
    file.

    Args:
        outputs: option name → path it would write (None: not written).
        inputs: what each group of inputs is (e.g. 'the script', 'a trace') → their paths.
    """
    given = {opt: Path(p) for opt, p in outputs.items() if p is not None}
    for opt, out in given.items():
        for what, paths in inputs.items():
            for p in paths:
                if _same_file(out, Path(p)):
                    raise OutputPathError(
                        f"{opt} {str(out)!r} is {what} ({p}): writing there would replace it. "
                        f"Give {opt} another path.")
    names = list(given)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _same_file(given[a], given[b]):
                raise OutputPathError(f"{a} and {b} both name {str(given[a])!r}: the second "
                                      "would replace the first. Give them different paths.")


def write_text_atomic(text: str, path: str | os.PathLike[str]) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    The new file keeps the mode of the file it replaces, else gets 0666 less the umask (as
    ``open(path, 'w')`` would).

    Args:
        text: the content, written as UTF-8.
        path: the destination file; its folder must exist.

    Returns:
        The destination, as a :class:`~pathlib.Path`.

    Raises:
        OSError: with the path in the message when the folder is missing or not writable, or
            the disk is full; the destination is then left untouched and no temporary file
            remains.
    """
    dest = Path(path)
    directory = dest.parent if str(dest.parent) else Path(".")
    try:
        mode = stat.S_IMODE(dest.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    import tempfile  # here: a command that writes nothing need not load it (random, shutil)

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {dest}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {dest}: {e.strerror}") from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
