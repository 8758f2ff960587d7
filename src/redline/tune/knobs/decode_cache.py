"""The decode cache: the loader served from a cache of the dataset's deterministic part (the
setup's ``cache_split``), filled once and timed, measured end to end against the current
pipeline, and kept only if the planned run is shorter with the fill
(:func:`redline.tune.decide.one_off_pays`). Where the trials keep the cache:
:mod:`redline.tune.decode_cache`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch.utils.data import DataLoader

from redline.data.cache_split import CacheSplit, cached_dataset, fill
from redline.tune.decide import one_off_pays
from redline.tune.decision import Detail, KnobRecord
from redline.tune.decode_cache import trial_store
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.samples import fresh
from redline.tune.tuned import TunePlanMismatchError

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

_NO_ARGUMENT = ("no argument: the dataset is served from redline.data.CachedDataset(source, "
                "deterministic, random), the split the tuned setup declared (a code line)")


def plan_dataset(plan: TunePlan, loader: DataLoader[Any], cache_split: CacheSplit | None) -> Any:
    """The dataset the tuned loader reads: the loader's own, or, where the plan keeps the
    decode cache, the same samples served from a cache of their deterministic part."""
    if not plan.decode_cache:
        return loader.dataset
    if cache_split is None:
        raise TunePlanMismatchError(
            "the plan serves the loader from a decode cache (decode_cache: true) and no cache "
            "split was given: pass cache_split=redline.data.CacheSplit(...) (the setup's) to "
            "apply_plan, or set decode_cache to false in the plan to train without the cache")
    return cached_dataset(cache_split, len(loader.dataset),  # type: ignore[arg-type]
                          plan.decode_cache_store)


@dataclass(kw_only=True)
class DecodeCacheFields:
    """The decode cache's settings in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    decode_cache: bool = False
    """Serve the loader from a cache of the deterministic part of each sample (the setup's
    ``cache_split``, :class:`redline.data.CacheSplit`): filled on first access, kept."""
    decode_cache_store: str | None = None
    """The cache's folder; None = ``CachedDataset``'s default (``/dev/shm/redline-cache``
    where /dev/shm has room for it, else ``~/.cache/redline/redline-cache``)."""


DECODE_CACHE_RECORD = KnobRecord(label="decode cache")


class DecodeCacheKnob(TuneKnob):
    name = "decode_cache"
    records = (DECODE_CACHE_RECORD,)
    plan_fields = DecodeCacheFields
    switches = ("tune_loader",)
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning_none=_NO_ARGUMENT,
                                                     hf_none=_NO_ARGUMENT)

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if path.dataset_cached:
            plan.decisions.append(DECODE_CACHE_RECORD.decision(
                reason="not tried: the dataset already is a CachedDataset"))
            return plan
        if plan.gpu_decode:
            plan.decisions.append(DECODE_CACHE_RECORD.decision(
                reason="not tried: the JPEGs are decoded on the device (GPU decode kept)"))
            return plan
        if path.cache_split is None:
            path.log("  decode cache: not tried (the setup declares no cache_split)")
            return plan
        setup = fresh(path.factory)
        if path.cache_store is None:
            path.cache_store = trial_store()
        cand = dataclasses.replace(plan, decode_cache=True, decode_cache_store=path.cache_store,
                                   decisions=[])
        workers = plan.loader.num_workers
        fill_s, items = fill(plan_dataset(cand, setup.loader, setup.cache_split), workers)
        fill_s = path.agree.max(fill_s, "decode cache fill")
        path.log(f"  decode cache: filled {items:,} items in {fill_s:.1f} s "
                 f"({workers} workers)")
        details: dict[str, Detail] = {"fill_s": round(fill_s, 2), "items": items,
                                      "fill_workers": workers}
        kept = path.decide(plan, cand, DECODE_CACHE_RECORD.decision(details=details),
                           step_only=False)
        if kept is plan:
            return plan
        decision = kept.decisions[-1]
        cur = decision.samples_per_s_before or 0.0
        new = decision.samples_per_s_after or 0.0
        steps, eff = path.steps_for(plan), plan.effective_batch
        pays, t_cur, t_new = one_off_pays(fill_s, eff / cur, eff / new, steps,
                                          path.cfg.min_gain)
        decision.reason += (f"; over {steps:,} steps: {t_new:,.0f} s cached (incl. "
                            f"{fill_s:.1f} s filling) vs {t_cur:,.0f} s")
        if pays:
            return kept
        decision.kept = False
        path.policy.current_tp = cur
        path.log("  decode cache: the fill does not pay over the planned run — not kept")
        return plan  # its decisions are the same list, with ``decision`` in it

    def apply_data(self, parts: LoopParts) -> None:
        if parts.plan.decode_cache:
            parts.dataset = plan_dataset(parts.plan, parts.user_loader, parts.cache_split)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.decode_cache:
            out.code.append("# decode cache: serve the dataset from redline.data.CachedDataset("
                            "source, deterministic, random), the split your tuned setup "
                            "declared")

    def summary(self, plan: TunePlan) -> list[str]:
        return ["decode cache"] if plan.decode_cache else []


DECODE_CACHE = DecodeCacheKnob()
