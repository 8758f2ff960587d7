"""Time DataLoader settings in the user's own loop after a run that starved for data.

The DataLoader that starved the loop is rebuilt with other settings and timed against a
stand-in for the measured step (its compute time per batch; see
:func:`redline.data.autotune.stand_in_consumer`); the report's data-starvation finding is then
replaced by one whose fix names the settings and the numbers
(:func:`redline.diagnose.advise.with_measured_loader`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from redline.core.report import Report
from redline.data.autotune import LoaderPlan, autotune_loader, rebuild_factory, stand_in_consumer
from redline.diagnose.advise import MeasuredLoader, with_loader_not_tuned, with_measured_loader


def tune_starved_loader(report: Report, loaders: list[Any], cpus: float | None = None,
                        batches_per_trial: int = 16,
                        rank: int | None = None) -> tuple[Report, LoaderPlan | None]:
    """Autotune the main DataLoader of a report with a data_starvation finding.

    Args:
        report: the run's report (left unchanged).
        loaders: the run's LoaderInfo list (kept with ``WatchConfig.keep_loaders``).
        cpus: the CPUs its workers may use (default: this process's).
        batches_per_trial: batches timed per loader setting (at least; see
            :func:`autotune_loader`).
        rank: in a multi-process job, the rank whose loaders these are: only a finding of the
            whole job or of this rank is answered with them (another rank's slow loader is not
            this one).

    Returns:
        (the report with its data-starvation finding replaced, the plan), or the report as
        given and None when there is nothing to tune (no starvation, no loader kept); a loader
        that cannot be rebuilt is said in the finding's evidence.
    """
    finding = next((f for f in report.findings if f.id == "data_starvation"
                    and f.rank in (None, rank)), None)
    info = next((li for li in loaders if li.loader is not None and li.iterators), None)
    if finding is None or info is None:
        return report, None
    m = report.measurements
    compute_s = sum(p.mean_s for p in m.breakdown if p.phase in ("forward", "backward",
                                                                  "optimizer"))
    if m.device.type == "cuda" and m.device_metrics.device_s_per_step:
        compute_s = m.device_metrics.device_s_per_step
    try:
        make = rebuild_factory(info.loader)
    except ValueError as e:
        new = with_loader_not_tuned(finding, str(e))
        plan = None
    else:
        plan = autotune_loader(make, stand_in_consumer(compute_s, m.device.type != "cuda"),
                               device=m.device.type, cpus=cpus,
                               batches_per_trial=batches_per_trial)
        best, first = plan.best, plan.trials[0]
        new = with_measured_loader(finding, MeasuredLoader(
            settings=plan.settings, torch_threads=plan.torch_threads,
            samples_per_s=best.samples_per_s, data_wait_fraction=best.data_wait_fraction,
            baseline_samples_per_s=first.samples_per_s,
            baseline_data_wait_fraction=first.data_wait_fraction, compute_s=compute_s,
            reason=plan.reason.split(". Chosen")[0]))
    findings = [new if f is finding else f for f in report.findings]
    return dataclasses.replace(report, findings=findings), plan
