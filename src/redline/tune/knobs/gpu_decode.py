"""JPEG decode on the device: the loader ships encoded JPEGs and the device decodes them
(nvJPEG) and takes the random crop, flip and normalization (the setup's ``jpeg_split``,
:mod:`redline.data.device_decode`). Tried on CUDA only, after the device path's pixels are
checked against the CPU path's on the first samples; measured end to end against the current
pipeline and kept only when faster. Where it is kept the decode cache is not tried: the CPU no
longer decodes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redline.data.device_decode import (
    IMAGE_MEAN_LEVELS_MAX,
    MEAN_LEVELS_MAX,
    P99_LEVELS_MAX,
    DeviceDecoder,
    compare_paths,
    device_decode_unavailable,
)
from redline.tune.decision import Detail, KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.decode_cache import DECODE_CACHE_RECORD
from redline.tune.knobs.loader import LOADER_RECORD, plan_data

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

_NO_ARGUMENT = ("no argument: the loader reads redline.data.device_decode.EncodedJpegs with "
                "collate_encoded, and each batch goes through DeviceDecoder(jpeg_split, device) "
                "before the step (code lines)")

@dataclass(kw_only=True)
class GpuDecodeFields:
    """Whether the plan decodes JPEGs on the device. Part of :class:`~redline.tune.knobs.TunePlan`."""

    gpu_decode: bool = False
    """The loader ships encoded JPEGs and the device decodes and augments them (the setup's
    ``jpeg_split``, :class:`redline.data.JpegSplit`; :mod:`redline.data.device_decode`)."""


GPU_DECODE_RECORD = KnobRecord(label="GPU decode")
_DATA_KNOBS = (LOADER_RECORD.label, GPU_DECODE_RECORD.label, DECODE_CACHE_RECORD.label)
"""The input pipeline's own knobs: keeping one does not make the step faster."""


class GpuDecodeKnob(TuneKnob):
    name = "gpu_decode"
    records = (GPU_DECODE_RECORD,)
    plan_fields = GpuDecodeFields
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
            plan.decisions.append(GPU_DECODE_RECORD.decision(reason=f"not tried: {why}"))
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
        return path.decide(plan, cand, GPU_DECODE_RECORD.decision(details=details),
                           step_only=False)

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """Measured and not kept at the start, where the step was slow enough for the CPUs to
        feed it: once a later knob made the step faster the decode may be what binds, so it is
        measured again (the loader's second visit then provisions the encoded pipeline)."""
        first = [d for d in plan.decisions if d.knob == GPU_DECODE_RECORD.label]
        if plan.gpu_decode or not first or first[-1].measured is None:
            return plan  # kept, or refused before measuring (no device decoder, pixels differ)
        if not any(d.kept for d in plan.decisions if d.knob not in _DATA_KNOBS):
            return plan
        path.log("GPU decode, again (the step got faster)")
        cand = dataclasses.replace(plan, gpu_decode=True, decode_cache=False,
                                   decode_cache_store=None, decisions=[])
        return path.decide(plan, cand, GPU_DECODE_RECORD.decision(
            again=True, details=dict(first[-1].details)), step_only=False)

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

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.gpu_decode:
            out.code.append(
                "# GPU decode: the loader reads redline.data.device_decode.EncodedJpegs("
                "jpeg_split, len(dataset)) with collate_fn=collate_encoded, and each batch goes "
                "through DeviceDecoder(jpeg_split, device) before the step")

    def summary(self, plan: TunePlan) -> list[str]:
        return ["GPU decode"] if plan.gpu_decode else []


GPU_DECODE = GpuDecodeKnob()
