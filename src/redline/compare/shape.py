"""The fields of a redline document that a comparison reads, checked before they are read.

A report or plan cut short, edited into another shape, or written by a newer redline is
refused with its file, the field, what the field holds and what was expected, never compared
on a misread number. A field that is absent or ``null`` is unknown, as in any report (a report
of an older schema lacks some): only a field that holds something else is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from redline.compare.model import CompareInputError
from redline.core.report import SCHEMA_VERSION

PLAN_SCHEMA_READ = "redline.parallel-plan/1"
"""The newest plan schema this redline reads (``report/plan_render.py``'s ``PLAN_SCHEMA``,
checked equal by the tests: ``compare/`` sits below ``report/`` and cannot import it)."""

REWRITE = {"report": "write it again with `redline doctor --json PATH`",
           "plan": "write it again with `redline plan --json PATH`"}
"""What to do about a document that cannot be read, by kind."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


Check = tuple[Callable[[Any], bool], str]
"""A test of a field's value and what it expects, in words."""
OBJECT: Check = (lambda v: isinstance(v, dict), "a JSON object")
LIST: Check = (lambda v: isinstance(v, list), "a JSON list")
STRING: Check = (lambda v: isinstance(v, str), "a string")
INTEGER: Check = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
NUMBER: Check = (_is_number, "a finite number")
SECONDS: Check = (lambda v: _is_number(v) and v >= 0,
                  "a duration in seconds (a finite number ≥ 0)")
COUNT: Check = (lambda v: _is_number(v) and v >= 0, "a finite number ≥ 0")

REPORT_FIELDS: tuple[tuple[str, Check], ...] = (
    ("measurements", OBJECT),
    ("measurements.timing", OBJECT),
    ("measurements.timing.step_times_s", LIST),
    ("measurements.timing.step_times_s.*", SECONDS),
    ("measurements.timing.steps_measured", INTEGER),
    ("measurements.timing.step_time_mean_s", SECONDS),
    ("measurements.timing.step_time_p50_s", SECONDS),
    ("measurements.timing.step_time_p95_s", SECONDS),
    ("measurements.timing.samples_per_step", COUNT),
    ("measurements.timing.throughput_samples_per_s", COUNT),
    ("measurements.breakdown", LIST),
    ("measurements.breakdown.*", OBJECT),
    ("measurements.breakdown.*.phase", STRING),
    ("measurements.breakdown.*.mean_s", SECONDS),
    ("measurements.breakdown.*.fraction", NUMBER),
    ("measurements.device", OBJECT),
    ("measurements.config", OBJECT),
    ("measurements.config.precision", STRING),
    ("measurements.config.loader", OBJECT),
    ("measurements.host", OBJECT),
    ("measurements.device_metrics", OBJECT),
    ("measurements.mfu", OBJECT),
    ("measurements.nvml", OBJECT),
    ("findings", LIST),
    ("findings.*", OBJECT),
    ("findings.*.id", STRING),
    ("findings.*.rank", INTEGER),
    ("findings.*.severity", STRING),
    ("findings.*.ceiling_speedup", NUMBER),
    ("ranks", OBJECT),
    ("ranks.world_size", INTEGER),
    ("timeline", OBJECT),
    ("timeline.steps", LIST),
    ("timeline.steps.*", LIST),
)
"""What :mod:`redline.compare.reports` reads of a report, parents before their fields."""

PLAN_FIELDS: tuple[tuple[str, Check], ...] = (
    ("chosen", OBJECT),
    ("chosen.dp", INTEGER),
    ("chosen.time", OBJECT),
    *((f"chosen.time.{term}", SECONDS) for term in (
        "step_s", "compute_s", "dp_exposed_s", "pp_exposed_s", "tp_comm_s", "offload_s")),
    ("training", OBJECT),
    ("training.global_batch", COUNT),
    ("training.precision", STRING),
    ("cluster", OBJECT),
    ("cluster.gpus", INTEGER),
    ("cluster.gpu_name", STRING),
)
"""What :mod:`redline.compare.plan` reads of a plan, parents before their fields."""


def _holds(v: Any) -> str:
    """What a JSON value is, in words, with the value when it is short."""
    kind = {dict: "a JSON object", list: "a JSON list", str: "a JSON string",
            bool: "a JSON boolean"}.get(type(v))
    if kind is None:
        kind = "a number" if _is_number(v) else f"a {type(v).__name__}"
    text = repr(v)
    return f"{kind} ({text})" if len(text) <= 40 else kind


def _values(doc: Any, parts: list[str], where: str) -> list[tuple[str, Any]]:
    """(dotted name, value) of every value at ``parts`` (``*``: each item of a list); a path
    that stops at an absent or null field has none."""
    if not parts:
        return [(where, doc)]
    head, rest = parts[0], parts[1:]
    if head == "*":
        if not isinstance(doc, list):
            return []
        return [pair for i, item in enumerate(doc)
                for pair in _values(item, rest, f"{where}[{i}]")]
    if not isinstance(doc, dict) or doc.get(head) is None:
        return []
    return _values(doc[head], rest, f"{where}.{head}" if where else head)


def schema_version(schema: Any, prefix: str) -> int | None:
    """The version number of ``schema`` (``prefix`` + an integer), None when it has none."""
    if not isinstance(schema, str) or not schema.startswith(prefix):
        return None
    tail = schema[len(prefix):]
    return int(tail) if tail.isdigit() else None


def check_schema(doc: Any, source: str, kind: str, newest: str) -> None:
    """Refuse a document that is not a JSON object of ``kind`` with a schema this redline reads
    (its own ``newest`` or an older version of it).

    Raises:
        CompareInputError: not an object, no schema of that kind, or a newer one.
    """
    if not isinstance(doc, dict):
        raise CompareInputError(f"{source}: {_holds(doc)}; expected a {kind} (a JSON object "
                                f"with schema {newest!r}): {REWRITE[kind]}")
    prefix = newest.rsplit("/", 1)[0] + "/"
    schema = doc.get("schema")
    version = schema_version(schema, prefix)
    known = schema_version(newest, prefix)
    assert known is not None
    if version is None:
        raise CompareInputError(
            f"{source}: a document with schema {schema!r}; expected a {kind} with schema "
            f"{prefix}N (N ≤ {known}): {REWRITE[kind]}")
    if version > known:
        raise CompareInputError(
            f"{source}: a {kind} of schema {schema!r}, newer than this redline reads (up to "
            f"{newest!r}): upgrade redline (pip install -U redline) to compare it, or compare "
            "with the redline that wrote it")


def check_fields(doc: dict[str, Any], source: str, kind: str,
                 fields: tuple[tuple[str, Check], ...]) -> None:
    """Refuse the first field of ``fields`` whose value is not what a comparison reads.

    Raises:
        CompareInputError: naming the file, the field, what it holds and what was expected.
    """
    for path, (ok, expected) in fields:
        for name, value in _values(doc, path.split("."), ""):
            if value is not None and not ok(value):
                raise CompareInputError(
                    f"{source}: `{name}` is {_holds(value)}; expected {expected} (or null). "
                    f"The {kind} may be cut short or edited by hand: {REWRITE[kind]}")


def check_report(doc: Any, source: str) -> None:
    """Refuse a report a comparison cannot read (:func:`check_schema`, :func:`check_fields`).

    Raises:
        CompareInputError: what is wrong, where, and what to do.
    """
    check_schema(doc, source, "report", SCHEMA_VERSION)
    check_fields(doc, source, "report", REPORT_FIELDS)


def check_plan(doc: Any, source: str) -> None:
    """Refuse a plan a comparison cannot read (:func:`check_schema`, :func:`check_fields`).

    Raises:
        CompareInputError: what is wrong, where, and what to do.
    """
    check_schema(doc, source, "plan", PLAN_SCHEMA_READ)
    check_fields(doc, source, "plan", PLAN_FIELDS)
