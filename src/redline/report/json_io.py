"""JSON form of the report: a plain dict (schema ``redline/report/schema.json``), written
atomically so a crash or a full disk never leaves half a file."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from redline.core.files import write_text_atomic

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:  # the trace's JSON uses clean/plain alone, without the report's records
    from typing import Any

    from redline.core.report import Report


def clean(v: Any) -> Any:
    """NaN/inf are not JSON: an undefined number is unknown (None)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean(item) for k, item in v.items()}
    if isinstance(v, list | tuple):
        return [clean(item) for item in v]
    return v


def plain(v: Any) -> Any:
    """``v`` as JSON reads it back: plain dicts, lists, numbers and strings, other objects
    (paths, enums) as their ``str``, NaN/inf as None. What the HTML page embeds, and what the
    JSON file it sits beside holds."""
    return json.loads(json.dumps(clean(v), default=str))


def to_dict(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (what :func:`write_json` writes).

    Args:
        report: the report.

    Returns:
        Nested dicts and lists of the report's fields; NaN and infinite numbers become None.
    """
    doc: dict[str, Any] = clean(dataclasses.asdict(report))
    return doc


def schema() -> dict[str, Any]:
    """The JSON Schema the report's JSON follows (``report/schema.json`` in the package).

    Returns:
        The schema, parsed.
    """
    from importlib import resources

    loaded_schema: dict[str, Any] = json.loads(
        resources.files("redline").joinpath("report/schema.json").read_text())
    return loaded_schema


def write_json(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the report to ``path`` via a temporary file and an atomic rename.

    Args:
        report: the report.
        path: the destination file; its folder must exist.

    Returns:
        The destination, as a :class:`~pathlib.Path`.

    Raises:
        OSError: with the path in the message when the directory is missing or not writable,
            or the disk is full; the destination is then left untouched.
    """
    return write_text_atomic(json.dumps(to_dict(report), indent=2, allow_nan=False, default=str),
                             path)
