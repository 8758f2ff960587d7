"""Thresholds of the rules, each with its source."""

DATA_WAIT_MIN_FRACTION = 0.05
"""Data wait ≥ 5 % of step time → data_starvation. PyTorch TB-profiler plugin rule
'DataLoader ÷ step > 5 %' (gpu_metrics_anchors.md, bottleneck rules)."""

CPU_BOUND_MIN_FRACTION = 0.5
"""A fetch is CPU work when the CPU it burned is ≥ half its wall time; below that the fetcher
mostly waited (storage, network, sleep). redline's own split (data_pipeline_anchors.md §10.1)."""

SECONDARY_MIN_SHARE = 0.3
"""The minor side of the split is reported too when it makes ≥ 30 % of the data wait (and
≥ 5 % of the step): a mixed pipeline needs both fixes."""

H2D_MIN_FRACTION = 0.05
"""Host→device copies ≥ 5 % of step time (same order as the data-wait rule)."""

SYNC_MIN_IDLE_FRACTION = 0.05
"""Host syncs are reported when the device idles ≥ 5 % of the step inside its work span."""

SMALL_BATCH_MAX_MEMORY_FRACTION = 0.5
"""Peak reserved memory < 50 % of the device and the device not kept busy → room for a larger
batch (TB plugin's 'GPU utilization < 0.5 → increase batch size' rule, by memory headroom)."""

SMALL_BATCH_MAX_BUSY = 0.8
"""Device span below 80 % of step time; DCGM: SM-active ≥ 0.8 'necessary' for effective use."""

WORKER_RESPAWN_MIN_FRACTION = 0.01
"""Worker start-up ≥ 1 % of the measured wall time is worth `persistent_workers=True`."""

MIN_COMPUTE_FRACTION = 0.3
"""Precision findings need the device to compute ≥ 30 % of the step; below that, faster math
changes little (Amdahl) and the data or host findings come first (design §1 order)."""
