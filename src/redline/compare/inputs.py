"""What ``redline compare BEFORE AFTER`` was given, recognised by content, and the comparison
that pair calls for: two doctor reports, two sets of profiler traces, or a plan and a report.
Anything else is refused with what was received and what is expected."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from redline.compare.model import ALPHA, MIN_EFFECT_FRACTION, CompareInputError, Comparison
from redline.compare.plan import PLAN_SCHEMA_PREFIX, compare_plan
from redline.compare.reports import compare_reports
from redline.compare.shape import REWRITE
from redline.compare.traces import compare_traces
from redline.core.report import SCHEMA_VERSION

REPORT_SCHEMA_PREFIX = SCHEMA_VERSION.rsplit("/", 1)[0] + "/"
"""Any version of the report's schema: an older report is compared on what it holds."""
HEAD_BYTES = 1 << 16
"""How much of a file is read to tell a trace from a redline document."""

EXPECTED = ("two doctor reports (`redline doctor --json PATH`), two profiler traces (Kineto "
            "JSON files, .json or .json.gz, or folders of per-rank files), or a plan (`redline "
            "plan --json PATH`) and a doctor report of the run")


def kind_of(path: str) -> tuple[str, dict[str, Any] | None]:
    """('report' | 'plan' | 'trace', the document for a report or plan) of ``path``.

    Raises:
        CompareInputError: the path is missing, unreadable or not one of the inputs.
    """
    p = Path(path)
    if p.is_dir():
        return "trace", None
    try:
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        raise CompareInputError(f"{path}: cannot read it ({e.strerror or e}); expected "
                                f"{EXPECTED}") from None
    if head[:2] == b"\x1f\x8b" or b'"traceEvents"' in head:
        return "trace", None
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CompareInputError(f"{path}: not UTF-8 text ({e}); expected {EXPECTED}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CompareInputError(_not_json(path, text, e)) from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and schema.startswith(REPORT_SCHEMA_PREFIX):
        return "report", doc
    if isinstance(schema, str) and schema.startswith(PLAN_SCHEMA_PREFIX):
        return "plan", doc
    if isinstance(schema, str) and schema.startswith("redline.trace/"):
        raise CompareInputError(
            f"{path}: a trace analysis (`redline trace --json`), which keeps only the top "
            "kernels; compare the trace files themselves (give the .json/.json.gz files or "
            "their folder)")
    got = (f"a JSON document with schema {schema!r}" if schema is not None else
           f"a JSON {type(doc).__name__}" + (f" with keys {sorted(doc)[:6]}"
                                            if isinstance(doc, dict) else ""))
    raise CompareInputError(f"{path}: {got}; expected {EXPECTED}")


_SCHEMA_IN_TEXT = re.compile(r'"schema"\s*:\s*"((?:redline\.report|redline\.parallel-plan)/[^"]*)"')


def _not_json(path: str, text: str, e: json.JSONDecodeError) -> str:
    """Why ``text`` is not JSON, naming a redline document cut short as one (its schema is
    written first, so the head of a cut report still says what it was)."""
    m = _SCHEMA_IN_TEXT.search(text[:HEAD_BYTES])
    if m is None:
        return f"{path}: not a JSON document (JSONDecodeError: {e}); expected {EXPECTED}"
    kind = "report" if m[1].startswith(REPORT_SCHEMA_PREFIX) else "plan"
    where = f"at character {e.pos:,} of {len(text):,}"
    if not text[e.pos:].strip():
        return (f"{path}: a redline {kind} (schema {m[1]!r}) that ends early: not valid JSON "
                f"{where} (cut short? a copy or a write that did not finish): re-copy it or "
                f"{REWRITE[kind]}")
    return (f"{path}: a redline {kind} (schema {m[1]!r}) that is not valid JSON {where} (line "
            f"{e.lineno}, column {e.colno}: {e.msg}; edited by hand?): {REWRITE[kind]}")


def compare_paths(before: str, after: str, *, min_effect_fraction: float = MIN_EFFECT_FRACTION,
                  alpha: float = ALPHA) -> Comparison:
    """Recognise the two inputs and compare them.

    Args:
        before: the baseline: a doctor report, a trace file or folder, or a plan.
        after: the run judged against it: a report or a trace (a report after a plan).
        min_effect_fraction: the smallest relative change called a regression or improvement
            (0 ≤ it < 1).
        alpha: significance level of the two-sided test (0 < it < 1).

    Returns:
        The comparison, its verdict first.

    Raises:
        CompareInputError: an input is not one of the accepted kinds, the two do not make a
            pair, or a threshold is out of range.
        TraceError: a trace file is missing, unreadable or malformed.
    """
    if not 0 <= min_effect_fraction < 1:
        raise CompareInputError(f"`min_effect_fraction` must be in [0, 1), got "
                                f"{min_effect_fraction!r}")
    if not 0 < alpha < 1:
        raise CompareInputError(f"`alpha` must be in (0, 1), got {alpha!r}")
    kb, db = kind_of(before)
    ka, da = kind_of(after)
    opts = {"min_effect_fraction": min_effect_fraction, "alpha": alpha}
    if kb == ka == "report":
        assert db is not None and da is not None
        return compare_reports(db, da, before_source=before, after_source=after, **opts)
    if kb == ka == "trace":
        return compare_traces([before], [after], **opts)
    if {kb, ka} == {"plan", "report"}:
        plan, report = (db, da) if kb == "plan" else (da, db)
        assert plan is not None and report is not None
        out = compare_plan(plan, report, plan_source=before if kb == "plan" else after,
                           report_source=after if kb == "plan" else before, **opts)
        if kb != "plan":
            out.notes.append("the plan was given second: it is still the baseline (the "
                             "projection), the report the run judged against it")
        return out
    raise CompareInputError(
        f"cannot compare a {kb} ({before}) with a {ka} ({after}); expected {EXPECTED}")
