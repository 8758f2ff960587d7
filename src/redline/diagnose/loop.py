"""Host work in the training loop: the time outside every timed phase, named by the user's lines
that spent it (``Measurements.loop``, from the stack sampler and GC timing).

One rule per finding id: ``checkpoint_in_loop``, ``logging_in_loop``, ``gc_pauses``,
``batches_built_in_loop``, ``host_work_in_loop`` (other code, named by line) and
``periodic_stall``. A stall that comes back every k-th step is told inside the finding of its
kind ("every 5 steps"); ``periodic_stall`` is for one whose kind is not otherwise named.
"""

from __future__ import annotations

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import CodeSite, LoopWork, Measurements, PeriodicStall
from redline.core.words import ordinal
from redline.diagnose.thresholds import (
    HOST_CODE_MIN_FRACTION,
    HOST_WORK_MIN_FRACTION,
    LOOP_NAMING_MIN_SAMPLES,
    PERIODIC_MIN_FRACTION,
)

SITES_NAMED = 3
"""Lines a finding names in its title and evidence."""

_SPECIFIC = ("checkpoint", "logging", "batch")
"""Kinds with a finding of their own (GC has ``gc_pauses``, timed exactly)."""

_FRAMEWORKS = {
    "transformers": ("the Hugging Face Trainer", "a larger logging_steps, disable_tqdm=True"),
    "lightning": ("Lightning", "a larger log_every_n_steps, enable_progress_bar=False"),
    "pytorch_lightning": ("Lightning", "a larger log_every_n_steps, enable_progress_bar=False"),
    "accelerate": ("Accelerate", "fewer per-step gather() and log() calls"),
}
"""Packages whose own per-step code a sampled line can run through (``CodeSite.via``), with
the settings that make that code run less often."""

_FLOP_ESTIMATE = (
    "FLOP estimate for its logs (Trainer.floating_point_ops: the model's parameters are counted "
    "again at every step)",
    "Override floating_point_ops in a Trainer subclass to return a number computed once (or 0 "
    "where the logged total_flos is not used).")

_FRAMEWORK_FRAMES = {
    ("transformers", "_prepare_input"): (
        "move of each batch to the device (one .to() call per tensor of the batch)",
        "Let the collator return only the fields the model's forward takes "
        "(remove_unused_columns=True, the default) and keep dataloader_pin_memory=True on a "
        "GPU; a larger batch spreads this fixed cost over more samples."),
    ("transformers", "floating_point_ops"): _FLOP_ESTIMATE,
    ("transformers", "num_parameters"): _FLOP_ESTIMATE,
    ("transformers", "estimate_tokens"): _FLOP_ESTIMATE,
}
"""Framework functions whose per-step work the logging and progress settings do not change:
(package, function name prefix) → (what the function does, the fix). The fix of a framework's
other code is its logging and progress settings (:data:`_FRAMEWORKS`)."""


def _via_parts(site: CodeSite) -> tuple[str, str]:
    """(top-level package, function) of a site's ``via`` ('' for each where there is none)."""
    module, _, function = (site.via or "").partition(":")
    return module.split(".", 1)[0], function


def _framework_of(site: CodeSite) -> tuple[str, str] | None:
    """The training framework whose code spent a site's time, from its ``via``, and its
    settings; None for the user's own code or another library."""
    return _FRAMEWORKS.get(_via_parts(site)[0])


def _framework_frame(site: CodeSite) -> tuple[str, str] | None:
    """What a framework's function under a site does and its own fix, where the generic
    logging and progress settings would not change it (:data:`_FRAMEWORK_FRAMES`)."""
    package, function = _via_parts(site)
    return next((v for (pkg, prefix), v in _FRAMEWORK_FRAMES.items()
                 if pkg == package and function.startswith(prefix)), None)


def _where(site: CodeSite) -> str:
    return f"{site.file}:{site.line} ({site.function})"


def _removable(m: Measurements, fraction: float) -> float:
    """The share of the step a fix can give back. On CUDA the host's time between phases
    overlaps the kernels it queued before: the device waits at most for its idle share (one
    minus its measured span)."""
    span = m.device_metrics.device_span_fraction
    if m.device.type == "cuda" and span is not None:
        return min(fraction, max(0.0, 1.0 - span))
    return fraction


def _batches_in_loop(m: Measurements) -> bool:
    return m.config.data_source == "not seen" or m.counts.get("batches", 0) == 0


def _kind_of(site: CodeSite, m: Measurements) -> str:
    """The finding a site counts for: batch assembly only where no loader feeds the loop."""
    if site.kind == "batch" and not _batches_in_loop(m):
        return "code"
    if site.kind == "loader":
        return "code"
    return site.kind


def _kind_share(m: Measurements, lw: LoopWork, kind: str) -> float:
    """Share of the step of one finding's kind, over every sampled line (not only those
    listed); none where too few samples fell outside the phases to split them (GC pauses,
    timed exactly, are always known)."""
    kf = lw.kind_fractions
    if lw.samples < LOOP_NAMING_MIN_SAMPLES and kind != "gc":
        return 0.0
    if kind == "code":
        return (kf.get("code", 0.0) + kf.get("loader", 0.0)
                + (0.0 if _batches_in_loop(m) else kf.get("batch", 0.0)))
    if kind == "batch" and not _batches_in_loop(m):
        return 0.0
    return kf.get(kind, 0.0)


def _evidence(m: Measurements, lw: LoopWork, fraction: float,
              sites: list[CodeSite]) -> Evidence:
    step = m.timing.step_time_mean_s or 0.0
    ev: Evidence = {
        "step_fraction": round(fraction, 4),
        "ms_per_step": round(fraction * step * 1e3, 3),
        "other_fraction": round(lw.other_fraction, 4),
        "step_ms": round(step * 1e3, 3),
        "samples": lw.samples,
    }
    for i, s in enumerate(sites[:SITES_NAMED], 1):
        ev[f"site_{i}"] = _where(s)
        ev[f"site_{i}_fraction"] = round(s.step_fraction, 4)
        ev[f"site_{i}_code"] = s.text
        if s.via:
            ev[f"site_{i}_via"] = s.via
    return ev


def _sites_text(sites: list[CodeSite]) -> str:
    return "; ".join(f"{_where(s)} {s.step_fraction:.0%}"
                     + (f": `{s.text}`" if s.text else "") for s in sites[:SITES_NAMED])


def _period(lw: LoopWork, kind: str, m: Measurements) -> PeriodicStall | None:
    p = lw.periodic
    if p is None or p.phase != "other" or p.site is None or _kind_of(p.site, m) != kind:
        return None
    return p


def _kind_finding(m: Measurements, kind: str, fid: str, what: str, fix: str) -> list[Finding]:
    lw = m.loop
    if lw is None:
        return []
    sites = [s for s in lw.sites if _kind_of(s, m) == kind]
    f = _kind_share(m, lw, kind)
    if f < HOST_WORK_MIN_FRACTION or not sites:
        return []
    ev = _evidence(m, lw, f, sites)
    p = _period(lw, kind, m)
    every = ""
    if p is not None:
        every = (f", every {p.period_steps} steps ({p.extra_s_per_slow_step * 1e3:.0f} ms "
                 "each time)")
        ev["period_steps"] = p.period_steps
        ev["extra_ms_per_slow_step"] = round(p.extra_s_per_slow_step * 1e3, 3)
    removable = _removable(m, f)
    return [Finding(id=fid, severity=severity_for(f),
                    title=f"{what} takes {f:.0%} of each step{every}, at {_sites_text(sites)}",
                    evidence=ev, ceiling_speedup=ceiling_speedup(removable), fix=fix)]


def checkpoint_in_loop(m: Measurements) -> list[Finding]:
    """Checkpoint saves (``torch.save``, ``state_dict`` copies) between the training steps."""
    return _kind_finding(
        m, "checkpoint", "checkpoint_in_loop", "Saving checkpoints",
        "Save less often (every N steps, N such that saving stays under ~5 % of the time), or "
        "asynchronously: torch.distributed.checkpoint.async_save, or copy the state_dict to CPU "
        "tensors and write them from a background thread while training goes on. In a "
        "multi-process job save on one rank (rank 0) or use DCP's sharded save.")


def logging_in_loop(m: Measurements) -> list[Finding]:
    """Logging and host reads of tensor values (``.item()``, ``print``, file writes) between
    the steps."""
    return _kind_finding(
        m, "logging", "logging_in_loop", "Logging and reading values to the host",
        "Log every k steps, not every step; keep running values on the device (add "
        "loss.detach() into a tensor) and call .item()/.cpu() once per logging interval: on a "
        "GPU each .item() waits for every kernel queued before it. Compute per-parameter "
        "statistics only on the steps that write them.")


def batches_built_in_loop(m: Measurements) -> list[Finding]:
    """Batches assembled in the training loop itself (no DataLoader feeds it)."""
    cuda = m.device.type == "cuda"
    return _kind_finding(
        m, "batch", "batches_built_in_loop", "Building batches in the training loop",
        "Move the batch assembly into a Dataset (__getitem__ returns one sample) read through "
        "torch.utils.data.DataLoader(dataset, batch_size=…, num_workers=…, "
        + ("pin_memory=True, " if cuda else "") + "persistent_workers=True): the batches are "
        "then built in worker processes while the model trains, and redline measures the data "
        "wait that is left.")


def host_work_in_loop(m: Measurements) -> list[Finding]:
    """Other code between the phases, named by the lines that spent it."""
    lw = m.loop
    if lw is None:
        return []
    sites = [s for s in lw.sites if _kind_of(s, m) == "code"]
    f = _kind_share(m, lw, "code")
    if lw.samples < LOOP_NAMING_MIN_SAMPLES:
        # outside the phases with (almost) no sample to split it: say where the time is, if
        # large; only the GC pauses in it are known apart
        f = lw.other_fraction - lw.kind_fractions.get("gc", 0.0)
        if f < HOST_CODE_MIN_FRACTION:
            return []
        named = ("no stack sample named its code" if not lw.samples else
                 f"{lw.samples} stack sample(s) fell there, too few to name its code")
        return [Finding(
            id="host_work_in_loop", severity=severity_for(f),
            title=f"{f:.0%} of each step is spent outside every measured phase; {named}",
            evidence={"other_fraction": round(lw.other_fraction, 4), "samples": lw.samples},
            # the same bound as a sampled one's: what is outside the phases, less the kinds
            # other findings name, is what removing that code can give back
            ceiling_speedup=ceiling_speedup(_removable(m, f)),
            fix="Profile the loop between the optimizer step and the next forward (py-spy record, "
            "or `redline doctor --trace`) to find the code that spends it.")]
    if f < HOST_CODE_MIN_FRACTION:
        return []
    ev = _evidence(m, lw, f, sites)
    p = _period(lw, "code", m)
    if _mostly_periodic(p, f):
        return []  # periodic_stall names it: the period is the more precise diagnosis
    fix = ("This code runs in the training thread between steps, while the device waits for "
           "it: run it every k steps, move it to a background thread or into the DataLoader's "
           "workers, or vectorize it (tensor operations instead of Python loops).")
    framework = _framework_of(sites[0]) if sites else None
    if framework is not None:
        # The line is the user's call into the framework (``trainer.train()``): the time is the
        # framework's own per-step work, which the user changes through its settings.
        name, settings = framework
        ev["framework"] = name
        frame = _framework_frame(sites[0])
        if frame is not None:
            what, own_fix = frame
            fix = (f"The largest share is {name}'s own per-step work ({sites[0].via}), not "
                   f"code of yours: its {what}. {own_fix}")
        else:
            fix = (f"The largest share is {name}'s own per-step work ({sites[0].via}), not "
                   f"code of yours: log and refresh progress less often ({settings}), drop "
                   "per-step callbacks you do not need; a larger batch spreads this fixed "
                   "cost over more samples.")
    return [Finding(
        id="host_work_in_loop", severity=severity_for(f),
        title=f"Host code between the training phases takes {f:.0%} of each step: "
        f"{_sites_text(sites)}",
        evidence=ev, ceiling_speedup=ceiling_speedup(_removable(m, f)), fix=fix)]


def _mostly_periodic(p: PeriodicStall | None, code_share: float) -> bool:
    """Whether a periodic stall of other code makes at least half of that code's share: then
    it is reported as the periodic stall (with its period and line), not as host code."""
    return (p is not None and p.step_fraction >= PERIODIC_MIN_FRACTION
            and p.step_fraction >= 0.5 * code_share)


def gc_pauses(m: Measurements) -> list[Finding]:
    """Garbage-collection pauses (timed exactly through ``gc.callbacks``)."""
    lw = m.loop
    if lw is None or lw.gc_pause_fraction is None or lw.gc_pause_fraction < HOST_WORK_MIN_FRACTION:
        return []
    f = lw.gc_pause_fraction
    step = m.timing.step_time_mean_s or 0.0
    counts = lw.gc_collections
    ev: Evidence = {
        "gc_pause_fraction": round(f, 4),
        "gc_ms_per_step": round(f * step * 1e3, 3),
        "collections_gen0": counts[0] if counts else None,
        "collections_gen1": counts[1] if len(counts) > 1 else None,
        "collections_gen2": counts[2] if len(counts) > 2 else None,
        "step_ms": round(step * 1e3, 3),
    }
    explicit = [s for s in lw.gc_full_sites if s.text and "gc.collect(" in s.text]
    for i, s in enumerate(lw.gc_full_sites[:SITES_NAMED], 1):
        ev[f"site_{i}"] = _where(s)
        ev[f"site_{i}_fraction"] = round(s.step_fraction, 4)
        ev[f"site_{i}_code"] = s.text
    where = ""
    fix = ("Call gc.freeze() once the model, optimizer and loaders are built (the objects that "
           "live for the whole run leave the collector's scans; Python docs, gc.freeze), raise "
           "the collector's thresholds (gc.set_threshold(50_000, 50, 100)), or allocate fewer "
           "Python objects per step.")
    if explicit:
        s = explicit[0]
        where = f", {s.step_fraction:.0%} in gc.collect() at {_where(s)}"
        fix = (f"Remove the gc.collect() at {_where(s)} from the step, or call it every few "
               "hundred steps. " + fix)
    return [Finding(id="gc_pauses", severity=severity_for(f),
                    title=f"Garbage collection pauses the loop {f:.0%} of each step{where}",
                    evidence=ev, ceiling_speedup=ceiling_speedup(_removable(m, f)), fix=fix)]


def periodic_stall(m: Measurements) -> list[Finding]:
    """Every k-th step much slower, where its kind has no finding of its own."""
    lw = m.loop
    p = lw.periodic if lw is not None else None
    if lw is None or p is None or p.step_fraction < PERIODIC_MIN_FRACTION:
        return []
    if p.phase == "evaluation":
        return []  # evaluation_in_loop names it, with its period
    if (p.phase == "other" and p.site is not None and _kind_of(p.site, m) == "code"
            and not _mostly_periodic(p, _kind_share(m, lw, "code"))
            and _kind_share(m, lw, "code") >= HOST_CODE_MIN_FRACTION):
        return []  # a small part of a larger share of host code: host_work_in_loop names it
    if p.phase == "other" and p.site is not None and _kind_of(p.site, m) in _SPECIFIC:
        # told inside that kind's finding, when the kind reaches its own bar
        kind = _kind_of(p.site, m)
        bar = HOST_CODE_MIN_FRACTION if kind == "code" else HOST_WORK_MIN_FRACTION
        if _kind_share(m, lw, kind) >= bar:
            return []
    step = m.timing.step_time_p50_s or 0.0
    ev: Evidence = {
        "period_steps": p.period_steps,
        "slow_steps": p.slow_steps,
        "extra_ms_per_slow_step": round(p.extra_s_per_slow_step * 1e3, 3),
        "median_step_ms": round(step * 1e3, 3),
        "step_fraction": round(p.step_fraction, 4),
        "phase": p.phase,
    }
    where = f"in {p.phase}" if p.phase != "other" else "outside the measured phases"
    if p.site is not None:
        ev["site"] = _where(p.site)
        ev["site_code"] = p.site.text
        where += f", at {_where(p.site)}" + (f": `{p.site.text}`" if p.site.text else "")
    return [Finding(
        id="periodic_stall", severity=severity_for(p.step_fraction),
        title=f"Every {ordinal(p.period_steps)} step takes {p.extra_s_per_slow_step * 1e3:.0f} ms more "
        f"than the median step ({where}): {p.step_fraction:.0%} of the time",
        evidence=ev, ceiling_speedup=ceiling_speedup(_removable(m, p.step_fraction)),
        fix=f"Find what runs every {p.period_steps} steps there and move it off the step path (a "
        "background thread or process), spread it over the steps, or run it less often.")]
