"""The knobs of the tuning path, one module each, and the path: the list of their visits in
order (:data:`PATH`), run by :func:`redline.tune.run.tune`.

The plan's class, :class:`TunePlan`, is here too: its fields are the knobs' (each knob's
``plan_fields`` dataclass, declared in its module) and :class:`~redline.tune.tuned.PlanCore`'s.

Adding a knob: its module here (a :class:`~redline.tune.knob.TuneKnob` and one instance, its
decision records and its plan fields), its place in this module (:data:`KNOBS`, :data:`PATH`
and the bases of :class:`TunePlan`), and its tests (``tests/test_knobs.py`` fails when a part
is missing).
"""

from __future__ import annotations

from dataclasses import dataclass

from redline.tune.knob import TuneKnob, Visit
from redline.tune.knobs.batch import BATCH, BatchFields
from redline.tune.knobs.batch_change import BATCH_CHANGE, BatchChangeFields
from redline.tune.knobs.channels_last import CHANNELS_LAST, ChannelsLastFields
from redline.tune.knobs.compile import COMPILE, CompileFields
from redline.tune.knobs.cuda_graphs import CUDA_GRAPHS, CudaGraphsFields
from redline.tune.knobs.cudnn_benchmark import CUDNN_BENCHMARK, CudnnBenchmarkFields
from redline.tune.knobs.ddp import DDP, DdpFields
from redline.tune.knobs.decode_cache import DECODE_CACHE, DecodeCacheFields
from redline.tune.knobs.gpu_decode import GPU_DECODE, GpuDecodeFields
from redline.tune.knobs.loader import LOADER, LoaderFields
from redline.tune.knobs.optimizer import OPTIMIZER, OptimizerFields
from redline.tune.knobs.precision import PRECISION, PrecisionFields
from redline.tune.knobs.sdpa import SDPA
from redline.tune.tuned import PlanCore

KNOBS: tuple[TuneKnob, ...] = (LOADER, GPU_DECODE, DECODE_CACHE, BATCH, BATCH_CHANGE, PRECISION,
                               SDPA, CHANNELS_LAST, CUDNN_BENCHMARK, OPTIMIZER, COMPILE,
                               CUDA_GRAPHS, DDP)
"""Every knob, in the order of their first visits: the order a tuned loop applies them in,
stage by stage, and the order of the printed plan line."""

PATH: tuple[Visit, ...] = (
    # data pipeline: the input first, so the compute knobs are not judged behind it; the
    # decode moved to the device where it can be, else cached
    Visit(knob=LOADER), Visit(knob=GPU_DECODE), Visit(knob=DECODE_CACHE),
    # batch size, with gradient accumulation keeping the effective batch
    Visit(knob=BATCH), Visit(knob=BATCH_CHANGE),
    # mixed precision; a 16-bit precision kept frees memory for a larger micro-batch
    Visit(knob=PRECISION), Visit(knob=BATCH, again=True, after=("tune_precision",)),
    # kernels; 16-bit convolutions are fast in NHWC only, so channels_last reopens precision
    Visit(knob=SDPA), Visit(knob=CHANNELS_LAST),
    Visit(knob=PRECISION, again=True, after=("tune_kernels",)),
    Visit(knob=CUDNN_BENCHMARK), Visit(knob=OPTIMIZER), Visit(knob=COMPILE),
    Visit(knob=CUDA_GRAPHS), Visit(knob=BATCH, again=True, after=("tune_kernels",)),
    # communication, then the input again for the step the path ends with (its decode first)
    Visit(knob=DDP), Visit(knob=GPU_DECODE, again=True), Visit(knob=LOADER, again=True),
)
"""The path in its order: each knob's first visit, and the second visits a later change makes
worth it."""


LABELS = frozenset(record.label for knob in KNOBS for record in knob.records)
"""Every knob's decision labels: the ids a plan's decisions may carry."""


# The bases run from the last knob to the first: a dataclass takes its fields from its bases
# last to first, so the plan's fields (and its JSON) read in the path's order.
@dataclass(kw_only=True)
class TunePlan(DdpFields, CudaGraphsFields, CompileFields, OptimizerFields, CudnnBenchmarkFields,
               ChannelsLastFields, PrecisionFields, BatchChangeFields, BatchFields,
               DecodeCacheFields, GpuDecodeFields, LoaderFields, PlanCore):
    """Settings to apply to the plain loop (see :func:`redline.tune.apply_plan`): what the
    plan was made for (:class:`~redline.tune.tuned.PlanCore`) and every knob's fields, each
    documented in its knob's module."""

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (the last one may be smaller)."""
        return -(-self.effective_batch // self.micro_batch)

    def check_fields(self) -> None:
        """Raise ValueError on settings that contradict each other, or a decision of a knob
        the path does not have (a plan file edited by hand or written by another version)."""
        if self.micro_batch > self.effective_batch:  # (≥ 1: BatchFields checks it first)
            raise ValueError(f"need 1 <= micro_batch <= effective_batch, got {self.micro_batch}"
                             f" and {self.effective_batch}")
        for index, decision in enumerate(self.decisions):
            if decision.knob not in LABELS:
                raise ValueError(f"decisions[{index}].knob: {decision.knob!r} is not a knob of "
                                 f"the tuning path ({', '.join(sorted(LABELS))})")


__all__ = ["KNOBS", "PATH", "TunePlan"]
