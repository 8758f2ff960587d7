"""JPEG decode on the device: the loader ships encoded JPEGs and the device decodes them
(nvJPEG) and takes the random crop, flip and normalization (the setup's ``jpeg_split``,
:mod:`redline.data.device_decode`). Tried on CUDA only, after the device path's pixels are
checked against the CPU path's on the first samples; measured end to end against the current
pipeline and kept only when faster. Where it is kept the decode cache is not tried: the CPU no
longer decodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from torch.utils.data import DataLoader

from redline.data.cache_split import CacheSplit
from redline.data.device_decode import (
    IMAGE_MEAN_LEVELS_MAX,
    MEAN_LEVELS_MAX,
    P99_LEVELS_MAX,
    DeviceDecoder,
    EncodedJpegs,
    JpegSplit,
    collate_encoded,
    compare_paths,
    device_decode_unavailable,
)
from redline.tune.decision import Decision, Detail, Knob
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.decode_cache import plan_dataset
from redline.tune.tuned import TunePlan, TunePlanMismatchError

_NO_ARGUMENT = ("no argument: the loader reads redline.data.device_decode.EncodedJpegs with "
                "collate_encoded, and each batch goes through DeviceDecoder(jpeg_split, device) "
                "before the step (code lines)")


def plan_data(plan: TunePlan, loader: DataLoader[Any], cache_split: CacheSplit | None,
              jpeg_split: JpegSplit | None) -> tuple[Any, Callable[[Any], Any] | None]:
    """The dataset and collate the tuned loader reads: encoded JPEGs where the plan decodes on
    the device, else the loader's own dataset or its decode cache (and the loader's collate).

    Args:
        plan: the tuned settings.
        loader: the user's loader.
        cache_split: the setup's decode-cache split, or None.
        jpeg_split: the setup's JPEG split, or None.

    Returns:
        (dataset, collate_fn or None for the loader's own).

    Raises:
        TunePlanMismatchError: the plan decodes on the device and no ``jpeg_split`` was given.
    """
    if not plan.gpu_decode:
        return plan_dataset(plan, loader, cache_split), None
    if jpeg_split is None:
        raise TunePlanMismatchError(
            "the plan decodes JPEGs on the device (gpu_decode: true) and no JPEG split was "
            "given: pass jpeg_split=redline.data.JpegSplit(...) (the setup's) to apply_plan, "
            "or set gpu_decode to false in the plan to decode on the CPU")
    return EncodedJpegs(jpeg_split, len(loader.dataset)), collate_encoded  # type: ignore[arg-type]


_DATA_KNOBS = (Knob.LOADER, Knob.GPU_DECODE, Knob.DECODE_CACHE)
"""The input pipeline's own knobs: keeping one does not make the step faster."""


class GpuDecodeKnob(TuneKnob):
    name = "gpu_decode"
    records = (Knob.GPU_DECODE,)
    plan_fields = ("gpu_decode",)
    switches = ("tune_loader",)
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning_none=_NO_ARGUMENT,
                                                     hf_none=_NO_ARGUMENT)

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        split = path.jpeg_split
        if split is None:
            path.log("  GPU decode: not tried (the setup declares no jpeg_split)")
            return plan
        why = device_decode_unavailable(path.device)
        agreement = None
        if why is None:
            decoder = DeviceDecoder(split, path.device)
            agreement = compare_paths(split, path.device, decoder=decoder)
            if decoder.stats.images_on_cpu:
                why = f"the device decoder fell back to the CPU ({decoder.stats.fallback_reason})"
            elif not agreement.close:
                why = (f"the device path's pixels differ from the CPU path's by "
                       f"{agreement.mean_abs_levels:.2f} levels on average, "
                       f"{agreement.p99_abs_levels:.1f} at the 99th percentile, "
                       f"{agreement.worst_image_mean_levels:.2f} on average in the worst image "
                       f"(at most {MEAN_LEVELS_MAX:g}, {P99_LEVELS_MAX:g} and "
                       f"{IMAGE_MEAN_LEVELS_MAX:g} agree)")
        # every rank of a job takes the same path: one rank's refusal is the job's
        refusals = [(rank, reason) for rank, reason in
                    enumerate(path.agree.gather(why, "GPU decode: the device path checked"))
                    if reason is not None]
        if refusals and why is None:
            rank, reason = refusals[0]
            why = f"on rank {rank}, {reason}"
        if why is not None:
            plan.decisions.append(Decision(knob=Knob.GPU_DECODE, kept=False,
                                           reason=f"not tried: {why}"))
            path.log(f"  GPU decode: not tried ({why})")
            return plan
        assert agreement is not None
        path.log(f"  GPU decode: pixels within {agreement.mean_abs_levels:.2f} levels of the "
                 f"CPU path on average (99 % within {agreement.p99_abs_levels:.1f}) over "
                 f"{agreement.images} images")
        details: dict[str, Detail] = {
            "mean_abs_levels": round(agreement.mean_abs_levels, 3),
            "p99_abs_levels": round(agreement.p99_abs_levels, 3),
            "max_abs_levels": round(agreement.max_abs_levels, 3),
            "worst_image_mean_levels": round(agreement.worst_image_mean_levels, 3),
            "images_compared": agreement.images}
        cand = dataclasses.replace(plan, gpu_decode=True, decode_cache=False,
                                   decode_cache_store=None, decisions=[])
        return path.decide(plan, cand, Decision(knob=Knob.GPU_DECODE, kept=False, reason="",
                                                details=details),
                           step_only=False)

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """Measured and not kept at the start, where the step was slow enough for the CPUs to
        feed it: once a later knob made the step faster the decode may be what binds, so it is
        measured again (the loader's second visit then provisions the encoded pipeline)."""
        first = [d for d in plan.decisions if d.knob is Knob.GPU_DECODE]
        if plan.gpu_decode or not first or first[-1].measured is None:
            return plan  # kept, or refused before measuring (no device decoder, pixels differ)
        if not any(d.kept for d in plan.decisions if d.knob not in _DATA_KNOBS):
            return plan
        path.log("GPU decode, again (the step got faster)")
        cand = dataclasses.replace(plan, gpu_decode=True, decode_cache=False,
                                   decode_cache_store=None, decisions=[])
        return path.decide(plan, cand, Decision(knob=Knob.GPU_DECODE, kept=False, reason="",
                                                again=True, details=dict(first[-1].details)),
                           step_only=False)

    def apply_data(self, parts: LoopParts) -> None:
        if parts.plan.gpu_decode:
            parts.dataset, parts.collate_fn = plan_data(parts.plan, parts.user_loader,
                                                        parts.cache_split, parts.jpeg_split)

    def apply_step(self, parts: LoopParts) -> None:
        # First of the batch transforms (this knob applies before the others): the step's
        # other transforms see decoded images.
        if parts.plan.gpu_decode:
            assert parts.jpeg_split is not None  # apply_data refused a plan without one
            parts.batch_transforms.insert(0, DeviceDecoder(parts.jpeg_split, parts.device))

    def summary(self, plan: TunePlan) -> list[str]:
        return ["GPU decode"] if plan.gpu_decode else []


GPU_DECODE = GpuDecodeKnob()
