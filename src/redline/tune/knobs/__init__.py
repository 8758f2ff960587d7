"""The knobs of the tuning path, one module each, and the path: the list of their visits in
order (:data:`PATH`), run by :func:`redline.tune.run.tune`.

Adding a knob: its module here (a :class:`~redline.tune.knob.TuneKnob` and one instance), its
id in :class:`redline.tune.decision.Knob`, its fields in :class:`redline.tune.tuned.TunePlan`,
its place in :data:`KNOBS` and :data:`PATH`, and its tests (``tests/test_knobs.py`` fails when
a part is missing).
"""

from __future__ import annotations

from redline.tune.knob import TuneKnob, Visit
from redline.tune.knobs.batch import BATCH
from redline.tune.knobs.batch_change import BATCH_CHANGE
from redline.tune.knobs.channels_last import CHANNELS_LAST
from redline.tune.knobs.compile import COMPILE
from redline.tune.knobs.cuda_graphs import CUDA_GRAPHS
from redline.tune.knobs.cudnn_benchmark import CUDNN_BENCHMARK
from redline.tune.knobs.ddp import DDP
from redline.tune.knobs.decode_cache import DECODE_CACHE
from redline.tune.knobs.gpu_decode import GPU_DECODE
from redline.tune.knobs.loader import LOADER
from redline.tune.knobs.optimizer import OPTIMIZER
from redline.tune.knobs.precision import PRECISION
from redline.tune.knobs.sdpa import SDPA

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

PATH_FIELDS = ("key", "source_batch_size", "schema", "decisions", "notes")
"""The :class:`~redline.tune.tuned.TunePlan` fields no knob owns: what the plan was made for
and what the path recorded."""

__all__ = ["KNOBS", "PATH", "PATH_FIELDS"]
