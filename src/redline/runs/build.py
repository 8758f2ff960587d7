"""A report from a recorder: its measurements, every rule run over them (and over its trace, if
one was recorded), ranked, with how the run ended."""

from __future__ import annotations

import datetime as _dt
import warnings

import torch

from redline._version import __version__
from redline.core.findings import rank
from redline.core.report import (
    MAX_COUNTER_POINTS,
    MAX_TIMELINE_STEPS,
    SCHEMA_VERSION,
    Report,
    StepTimeline,
)
from redline.diagnose import diagnose, diagnose_trace, stall_note
from redline.measure.optional import SectionUnknown
from redline.measure.recorder import Recorder
from redline.measure.step_record import PHASES
from redline.measure.summary import build_measurements, recorded_trace
from redline.report.perfetto import rank_timeline


def _how_it_ended(w: Recorder, detail: str | None) -> tuple[str, str | None]:
    """The status of a watch whose caller did not say: from the exception that left its block,
    if one did, else from whether any step ran."""
    e = w.exit_error
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", detail or "interrupted (Ctrl-C)"
    if e is not None and not isinstance(e, GeneratorExit):
        return "script_error", detail or f"the watched block raised {type(e).__name__}: {e}"
    return ("completed" if w.steps else "no_steps"), detail


def step_timeline(w: Recorder) -> StepTimeline | None:
    """The recorder's steps and sampled counters, in seconds from the first step's start;
    None when no step closed."""
    timeline = rank_timeline(w)
    rows = timeline["steps"]
    if not rows:
        return None
    start_ns = rows[0][1]
    left_out = max(0, len(rows) - MAX_TIMELINE_STEPS)
    steps: list[list[object]] = [
        [index, round((start - start_ns) / 1e9, 9), round((end - start) / 1e9, 9), kind, samples,
         phases] for index, start, end, kind, samples, phases in rows[left_out:]]
    longest = max((len(pts) for pts in timeline["counters"].values()), default=0)
    stride = max(1, -(-longest // MAX_COUNTER_POINTS))
    counters = {name: [[round((time_ns - start_ns) / 1e9, 6), round(value, 6)]
                       for time_ns, value in pts[::stride]]
                for name, pts in timeline["counters"].items()}
    return StepTimeline(phases=list(PHASES), steps=steps, counters=counters,
                        steps_left_out=left_out, points_stride=stride)


def build_report(w: Recorder, command: list[str] | None = None, status: str | None = None,
                 status_detail: str | None = None) -> Report:
    """Measure, diagnose and assemble the report of a closed recorder.

    Args:
        w: a recorder (a watch or a doctor run) whose block has been left.
        command: the command line that ran, where known; None = not recorded.
        status: how the run ended ("completed", "interrupted", "script_error", "no_steps");
            None = read from the recorder.
        status_detail: a sentence on the status; None = read from the recorder with
            ``status``.

    Returns:
        The :class:`Report`: measurements, ranked findings (with the trace's when one was
        recorded), the trace analysis and the step timeline.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SectionUnknown)
        measurements = build_measurements(w)
    for warning in caught:  # an optional section that failed is said; other warnings pass on
        if issubclass(warning.category, SectionUnknown):
            measurements.notes.append(str(warning.message))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    note = stall_note(measurements)
    if note is not None:
        measurements.notes.append(note)
    if status is None:
        status, status_detail = _how_it_ended(w, status_detail)
    findings = diagnose(measurements) if measurements.timing.steps_total else []
    trace, analysis = recorded_trace(w)
    if analysis is not None:
        findings = rank([*findings, *diagnose_trace(analysis)])
    return Report(
        schema=SCHEMA_VERSION,
        redline_version=__version__,
        torch_version=torch.__version__,
        created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command,
        status=status,
        status_detail=status_detail,
        measurements=measurements,
        findings=findings,
        trace=trace,
        timeline=step_timeline(w),
    )
