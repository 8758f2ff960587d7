"""Hand-written attention (matmul → softmax → matmul), found by one forward under a dispatch
spy (:func:`redline.tune.kernels.find_unfused_attention`) and reported with the file and line
of its softmax: replacing it by ``scaled_dot_product_attention`` is a code change, so it is
neither applied nor measured."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from redline.data.prefetcher import map_tensors
from redline.tune.decision import KnobRecord
from redline.tune.kernels import find_unfused_attention
from redline.tune.knob import FrameworkWords, TuneKnob, TuningPath
from redline.tune.samples import fresh

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

_CODE_CHANGE = "none: replacing hand-written attention is a change to the model's code"

SDPA_RECORD = KnobRecord(label="sdpa")


class SdpaKnob(TuneKnob):
    name = "sdpa"
    records = (SDPA_RECORD,)
    plan_fields = None
    switches = ("tune_kernels",)
    heading = "4/4 kernels"
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning_none=_CODE_CHANGE,
                                                     hf_none=_CODE_CHANGE)
    advice_only = ("a code change (torch.nn.functional.scaled_dot_product_attention in the "
                   "model): reported with its location, never applied")

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        setup = fresh(path.factory)
        first = map_tensors(next(iter(setup.loader)), lambda tensor: tensor.to(path.device))
        sites = find_unfused_attention(setup.model, first, setup.loss_fn)
        for site in sites:
            plan.decisions.append(SDPA_RECORD.decision(
                reason=f"hand-written attention at {site.location} (scores "
                       f"{list(site.score_shape)}, {site.calls_per_forward}× per forward): "
                       "replace matmul→softmax→matmul with torch.nn.functional."
                       "scaled_dot_product_attention(q, k, v, is_causal=...) — a code change, "
                       "so not applied or measured here",
                details={"location": site.location}))
        path.attention_sites = sites
        return plan


SDPA = SdpaKnob()
