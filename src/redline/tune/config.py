"""How hard ``redline tune`` looks, and what its projections assume (no torch import: the
command line reads its defaults from here)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_RUN_STEPS = 10_000
"""Optimizer steps of the planned job when neither the setup nor the config says."""


@dataclass(kw_only=True, slots=True)
class NumericsTolerance:
    """How far a lower precision may drift from fp32 over the guard's steps."""

    loss_rel: float = 0.05
    """Max |loss − loss_fp32| ÷ |loss_fp32| at any step. bf16 keeps 8 mantissa bits (unit
    round-off 2⁻⁸ ≈ 0.4 %); a few steps of drift compound it, and 5 % separates that noise from
    divergence (a real loss-scale overflow or saturation moves the loss by far more)."""
    grad_norm_rel: float = 0.10
    """Max relative difference of the global gradient norm at any step."""
    max_overflow_steps: int = 1
    """fp16: GradScaler may skip this many steps while it calibrates its scale (it starts at
    2¹⁶ and halves on each overflow); more means the gradients do not fit fp16."""
    batch_change_min_progress: float = 0.5
    """``--allow-batch-change``: over the same samples from the same start, the larger batch's
    held-out loss must fall by at least half as much as the user's batch's. Fewer, larger
    steps trail early in training even where the scaling rule holds (a momentum buffer or
    Adam's moments build up over steps, not samples: 0.65–1.1 of the user's progress on the
    guard's few steps), while a rate too large to be stable moves the loss up, or to NaN."""

    def __post_init__(self) -> None:
        if (self.loss_rel <= 0 or self.grad_norm_rel <= 0 or self.max_overflow_steps < 0
                or not 0 < self.batch_change_min_progress <= 1):
            raise ValueError("tolerances must be > 0 (overflow steps >= 0)")


@dataclass(kw_only=True, slots=True)
class TuneConfig:
    """How hard ``tune`` looks, and what the projections assume."""

    steps_per_trial: int = 6
    """Measured optimizer steps per throughput trial (after warm-up)."""
    rounds: int = 2
    """Each comparison alternates current and candidate this many times (A B A B)."""
    warmup_steps: int = 2
    """Steps before each trial's measurement (allocator, workers, compile)."""
    numerics_steps: int = 6
    """Steps of the fp32-vs-candidate comparison."""
    tolerance: NumericsTolerance = field(default_factory=NumericsTolerance)
    """How far a lower precision may drift from fp32."""
    min_gain: float = 0.05
    """A change is kept only if it is ≥ 5 % faster (smaller differences are noise on shared
    machines; the loader autotune uses the same threshold)."""
    max_p: float = 0.05
    """…and, for knobs timed on the step alone, its per-step times are smaller than the current
    plan's with a one-sided Mann–Whitney p-value below this (tune/stats.py). Where the trials
    are too short for any outcome to reach it, and for end-to-end (loader) comparisons, whose
    per-step times are bursty, only ``min_gain`` decides; the decision says which."""
    run_steps: int | None = None
    """Optimizer steps of the planned job (overrides ``TrainSetup.run_steps``)."""
    price_per_device_hour: float | None = None
    """Currency units per device-hour for the cost projection; None = cost unknown."""
    loader_batches_per_trial: int = 16
    tune_loader: bool = True
    tune_batch: bool = True
    tune_precision: bool = True
    tune_kernels: bool = True
    tune_ddp: bool = True
    """A DistributedDataParallel model's bucket size and gradient-as-bucket-view are measured."""
    try_compile: bool = True
    """torch.compile is measured (its compile time is amortized over ``run_steps``)."""
    store_dir: str | None = None
    """Plan store folder; None = $REDLINE_CACHE_DIR/plans or ~/.cache/redline/plans."""
    reuse: bool = True
    """Reuse a remembered plan for the same key instead of searching again."""
    allow_batch_change: bool = False
    """The effective batch may grow (up to what memory allows, at most 8-fold) with the
    learning rate rescaled by a stated rule (:mod:`redline.tune.batch_change`): this changes
    the optimization, so it is off unless asked for."""

    def __post_init__(self) -> None:
        for name in ("steps_per_trial", "rounds", "numerics_steps", "loader_batches_per_trial"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
        if not 0 < self.max_p <= 1:
            raise ValueError(f"max_p must be in (0, 1], got {self.max_p}")
        if self.run_steps is not None and self.run_steps < 1:
            raise ValueError(f"run_steps must be >= 1, got {self.run_steps}")
        if self.price_per_device_hour is not None and self.price_per_device_hour < 0:
            raise ValueError(f"price_per_device_hour must be >= 0, got "
                             f"{self.price_per_device_hour}")
