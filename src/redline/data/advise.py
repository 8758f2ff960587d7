"""Turn a data-starvation finding into settings measured in the user's own loop.

After a run, the DataLoader that starved the loop is rebuilt with other settings and timed
against a stand-in for the measured step (its compute time per batch; see
:func:`redline.data.autotune.stand_in_consumer`). The finding's fix then names the settings
and the numbers, not a rule of thumb.
"""

from __future__ import annotations

from typing import Any

from redline.data.autotune import LoaderPlan, autotune_loader, rebuild_factory, stand_in_consumer
from redline.report.model import Report


def tune_starved_loader(report: Report, loaders: list[Any], cpus: float | None = None,
                        batches_per_trial: int = 16) -> LoaderPlan | None:
    """Autotune the main DataLoader of a report with a data_starvation finding.

    Args:
        report: the run's report; its data_starvation finding is updated in place.
        loaders: the run's LoaderInfo list (kept with ``WatchConfig.keep_loaders``).

    Returns:
        The plan, or None when there is nothing to tune (no starvation, no loader kept, a
        loader that cannot be rebuilt — said in the finding's evidence).
    """
    finding = next((f for f in report.findings if f.id == "data_starvation"), None)
    info = next((li for li in loaders if li.loader is not None and li.iterators), None)
    if finding is None or info is None:
        return None
    m = report.measurements
    compute_s = sum(p.mean_s for p in m.breakdown if p.phase in ("forward", "backward",
                                                                  "optimizer"))
    if m.device.type == "cuda" and m.device_metrics.device_s_per_step:
        compute_s = m.device_metrics.device_s_per_step
    try:
        make = rebuild_factory(info.loader)
    except ValueError as e:
        finding.evidence["loader_tuning"] = f"not run: {e}"
        return None
    plan = autotune_loader(make, stand_in_consumer(compute_s, m.device.type != "cuda"),
                           device=m.device.type, cpus=cpus, batches_per_trial=batches_per_trial)
    s, best, first = plan.settings, plan.best, plan.trials[0]
    kw = ", ".join(f"{k}={v!r}" for k, v in s.loader_kwargs().items())
    finding.evidence.update({
        "tuned_num_workers": s.num_workers, "tuned_prefetch_factor": s.prefetch_factor,
        "tuned_samples_per_s": round(best.samples_per_s, 1),
        "tuned_data_wait_fraction": round(best.data_wait_fraction, 4),
        "baseline_samples_per_s": round(first.samples_per_s, 1),
    })
    finding.fix = (f"Measured in your loop (against your step's {compute_s * 1e3:.1f} ms of "
                   f"compute): DataLoader(..., {kw}) and torch.set_num_threads({s.torch_threads})"
                   f" → {best.samples_per_s:,.0f} samples/s, data wait "
                   f"{best.data_wait_fraction:.0%} (with num_workers=0: "
                   f"{first.samples_per_s:,.0f} samples/s, {first.data_wait_fraction:.0%}). "
                   f"{plan.reason.split('. Chosen')[0]}.")
    return plan
