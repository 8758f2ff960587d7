"""What the framework callbacks share: one watch per ``fit`` / ``train``, driven by the
framework's own hooks.

The callbacks (:mod:`redline.integrations.lightning`, :mod:`redline.integrations.hf`) are thin:
they call :meth:`FitWatch.begin` at the start of training, :meth:`FitWatch.step` after each
optimizer step the framework reports, :meth:`FitWatch.skip` after an evaluation inside
training, :meth:`FitWatch.metrics` when its loggers are due, and :meth:`FitWatch.end` when
training ends or fails.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redline.core.files import OutputPathError, output_problem, refuse_overwriting_inputs
from redline.core.report import Report
from redline.integrations.errors import IntegrationError
from redline.measure.config import WatchConfig
from redline.measure.live import live_snapshot
from redline.report.html import HtmlReportError, write_html
from redline.report.html import check_available as check_html
from redline.report.json_io import to_dict, write_json
from redline.report.terminal import print_report
from redline.runs.watch import Watch


def check_report_path(path: str | None, name: str = "json_path") -> None:
    """Fail when the callback is built, not after hours of training, when the report could not
    be written: an existing folder, a missing or read-only parent (tried: a file is made there
    and removed, so a read-only mount is found as root too)."""
    if path is None:
        return
    problem = output_problem(name, path)
    if problem is None:
        parent = Path(path).parent
        try:
            fd, probe = tempfile.mkstemp(prefix=".redline-probe-", dir=parent)
        except OSError as e:
            problem = (f"{name} {path!r}: a file cannot be made in {str(parent)!r} "
                       f"({e.strerror}); give a path in a writable directory")
        else:
            os.close(fd)
            os.unlink(probe)
    if problem is not None:
        raise IntegrationError(problem)
    script = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else None
    try:
        refuse_overwriting_inputs({name: path}, {"the running script": [script] if script
                                                 else []})
    except OutputPathError as e:
        raise IntegrationError(str(e)) from None


def watch_config(config: WatchConfig | Mapping[str, Any] | None) -> WatchConfig:
    """The callback's ``config``: a :class:`WatchConfig`, a mapping of its fields
    (``{"warmup_steps": 5}``), or None (the defaults)."""
    if config is None:
        return WatchConfig()
    if isinstance(config, WatchConfig):
        return config
    if isinstance(config, Mapping):
        names = [f.name for f in dataclasses.fields(WatchConfig)]
        unknown = sorted(str(k) for k in config if k not in names)
        if unknown:
            raise IntegrationError(f"config has no field {', '.join(map(repr, unknown))}; "
                                   f"WatchConfig's fields are: {', '.join(names)}")
        try:
            return WatchConfig(**config)
        except (TypeError, ValueError) as e:
            raise IntegrationError(f"config={dict(config)!r}: {e}") from None
    raise IntegrationError(f"config must be a redline.WatchConfig, a dict of its fields or "
                           f"None, got {type(config).__name__}")


@dataclass(slots=True, kw_only=True)
class FitWatch:
    """A :class:`redline.Watch` over one training run whose steps the framework marks."""

    config: WatchConfig
    json_path: str | None = None
    """Where the report's JSON is written at the end (rank 0); None = not written."""
    html_path: str | None = None
    """Where the self-contained HTML report is written at the end (rank 0; needs
    ``redline[html]``); None = not written."""
    show: bool = True
    """Print the report at the end (rank 0)."""
    window_steps: int = 50
    """Measured steps the logged metrics are over (the most recent ones)."""
    watch: Watch | None = None
    report: Report | None = None
    """The last run's report, once it ended."""
    _open: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.window_steps < 1:
            raise IntegrationError(f"window_steps must be >= 1, got {self.window_steps}")
        check_report_path(self.json_path)
        check_report_path(self.html_path, "html_path")
        if self.html_path is not None:
            try:
                check_html()
            except HtmlReportError as e:
                raise IntegrationError(str(e)) from None
            if self.json_path is not None and \
                    Path(self.json_path).resolve() == Path(self.html_path).resolve():
                raise IntegrationError(f"json_path and html_path name the same file "
                                       f"({self.html_path!r}): give each its own path")

    @property
    def running(self) -> bool:
        return self._open

    def begin(self) -> None:
        """Enter a new watch (a second ``fit`` gets its own); a run left open by a framework
        that did not call its end hook is ended first."""
        if self._open:
            self.end(RuntimeError("training started again before the previous run ended"))
        self.report = None
        self.watch = Watch(self.config)
        self.watch.__enter__()
        self._open = True

    def step(self) -> None:
        """The framework took an optimizer step: the step in progress ends here."""
        if self._open and self.watch is not None:
            self.watch.step()

    def skip(self) -> None:
        """What ran since the last step (evaluation, a checkpoint) is not a training step."""
        if self._open and self.watch is not None:
            self.watch.skip()

    def training_loaders(self, loaders: list[Any]) -> None:
        """The framework's training DataLoaders: the report describes them, not another
        loader the framework iterated first (a validation sanity check)."""
        if self._open and self.watch is not None:
            for loader in loaders:
                self.watch.training_loader(loader)

    def metrics(self, prefix: str = "redline/") -> dict[str, float]:
        """The recent steps' metrics for the framework's loggers; empty during warm-up."""
        if not self._open or self.watch is None:
            return {}
        snap = live_snapshot(self.watch, self.window_steps)
        return snap.as_metrics(prefix) if snap is not None else {}

    def end(self, error: BaseException | None = None) -> Report | None:
        """Close the watch, build the report (merged on rank 0 of a multi-process job), print
        and write it; returns it (None when no run was open, or when it could not be built).

        Never raises for the report: the training it measured is done, and the script's own
        next lines (saving the model) must run. A report that cannot be built or written is
        a warning naming the path and the error; a report not written is printed."""
        if not self._open or self.watch is None:
            return None
        self._open = False
        w = self.watch
        try:
            w.close(error)
            rep = w.report(show=self.show)
        except Exception as e:
            _warn(f"redline: the report of this run could not be built ({type(e).__name__}: "
                  f"{e}); training is not affected")
            return None
        self.report = rep
        if w.rank.rank != 0:
            return rep
        lost = False
        for path, write in ((self.json_path, lambda p: write_json(rep, p)),
                            (self.html_path, lambda p: write_html([to_dict(rep)], p,
                                                                  ["training run"]))):
            if path is None:
                continue
            try:
                write(path)
            except Exception as e:
                lost = True
                _warn(f"redline: the report was not written to {path!r} ({type(e).__name__}: "
                      f"{e}); training is not affected" + ("" if self.show else
                                                            ", the report follows"))
        if lost and not self.show:
            print_report(rep)
        return rep


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def end_metrics(report: Report | None, prefix: str = "redline/") -> dict[str, float]:
    """What the loggers get once, at the end: the whole window's numbers and the finding
    count."""
    if report is None:
        return {}
    m = report.measurements
    out: dict[str, float] = {f"{prefix}findings": float(len(report.findings))}
    t = m.timing
    if t.step_time_mean_s is not None:
        out[f"{prefix}run_step_time_ms"] = t.step_time_mean_s * 1e3
    if t.steps_measured:
        out[f"{prefix}run_data_wait_share"] = m.fraction("data_wait")
    if m.device_metrics.device_span_fraction is not None:
        out[f"{prefix}run_device_busy_share"] = m.device_metrics.device_span_fraction
    if m.mfu.mfu is not None:
        out[f"{prefix}run_mfu"] = m.mfu.mfu
    return out
