"""A model given as code: the ``redline tune`` factory contract, called on the meta device, so
its parameters and activations are counted without allocating them."""

from __future__ import annotations

from typing import Any

import torch

from redline.plan.activations import MeasuredActivations, activation_bytes
from redline.plan.limits import PlanInputError
from redline.plan.spec import ModelSpec, from_module
from redline.tune.setup import Factory, SetupError, call_factory


def from_factory(factory: Factory, precision: str = "bf16",
                 ) -> tuple[ModelSpec, MeasuredActivations | None, str | None, int]:
    """(the model's spec, its activations counted, why not if they could not be, the setup's
    per-device micro-batch). The factory runs under ``torch.device("meta")``: the model, and
    tensors its dataset builds there, take no memory."""
    try:
        with torch.device("meta"):
            s = call_factory(factory, "the setup factory")
    except SetupError as e:
        raise PlanInputError(f"{e} (it ran on the meta device: a factory that needs real "
                             "tensors, e.g. loading weights, cannot be planned this way; give "
                             "`params` and the shape instead)") from None
    spec = from_module(s.model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    ds = s.loader.dataset
    try:
        sample = ds[0]
    except Exception as e:
        return spec, None, f"the dataset's first sample could not be read ({e})", s.micro_batch

    def make(b: int) -> Any:
        return s.loader.collate_fn([sample] * b)

    def forward(model: torch.nn.Module, batch: Any) -> Any:
        from redline.data.prefetcher import map_tensors

        return s.loss_fn(model, map_tensors(batch, lambda t: t.to("meta")))

    try:
        measured = activation_bytes(s.model, make, forward, dtype=dtype)
    except PlanInputError as e:
        return spec, None, str(e), s.micro_batch
    return spec, measured, None, s.micro_batch
