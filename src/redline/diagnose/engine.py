"""The rule registry: one function per finding id, run over the measurements of a watch or
over a trace analysis, and the findings ranked by the gain they promise.

Every id of :data:`redline.core.findings.CATALOGUE` has a rule here (the trace's rules are
registered in :mod:`redline.diagnose.trace_rules`, which ``redline trace`` loads alone), or is
listed in :data:`NOT_DIAGNOSED` with the reason (a test holds this).
"""

from __future__ import annotations

from collections.abc import Callable

from redline.core.findings import Finding, rank
from redline.core.measurements import Measurements
from redline.core.report import RanksReport
from redline.diagnose import data, ddp, device, evaluation, host, loop, ranks, trends
from redline.diagnose.trace_rules import JOB_RULES as JOB_RULES
from redline.diagnose.trace_rules import TRACE_RULES as TRACE_RULES
from redline.diagnose.trace_rules import diagnose_trace as diagnose_trace

Rule = Callable[[Measurements], list[Finding]]
RanksRule = Callable[[RanksReport], list[Finding]]

RULES: dict[str, Rule] = {
    "data_starvation": data.data_starvation,
    "cpu_preprocessing": data.cpu_preprocessing,
    "storage_fetch": data.storage_fetch,
    "fetch_wait": data.fetch_wait,
    "cpu_contention": host.cpu_contention,
    "h2d_copy": data.h2d_copy,
    "thread_oversubscription": host.thread_oversubscription,
    "shm_too_small": host.shm_too_small,
    "copy_on_access_dataset": host.copy_on_access_dataset,
    "worker_respawn": host.worker_respawn,
    "evaluation_in_loop": evaluation.evaluation_in_loop,
    "checkpoint_in_loop": loop.checkpoint_in_loop,
    "logging_in_loop": loop.logging_in_loop,
    "gc_pauses": loop.gc_pauses,
    "batches_built_in_loop": loop.batches_built_in_loop,
    "host_work_in_loop": loop.host_work_in_loop,
    "periodic_stall": loop.periodic_stall,
    "memory_growth": trends.memory_growth,
    "step_time_drift": trends.step_time_drift,
    "step_time_bimodal": trends.step_time_bimodal,
    "host_sync": device.host_sync,
    "small_batch": device.small_batch,
    "no_mixed_precision": device.no_mixed_precision,
    "fp32_matmul_on_tensor_cores": device.fp32_matmul_on_tensor_cores,
    "sync_every_microbatch": ddp.sync_every_microbatch,
    "unused_parameter_search": ddp.unused_parameter_search,
    "small_ddp_buckets": ddp.small_ddp_buckets,
    "ddp_static_graph": ddp.static_graph,
    "gradient_bucket_copies": ddp.gradient_bucket_copies,
}
"""Rules over the always-on measurements of one process."""

RANK_RULES: dict[str, RanksRule] = {
    "straggler": ranks.straggler,
}
"""Rules over the merged ranks of a multi-process watch."""

NOT_DIAGNOSED: dict[str, str] = {}
"""Catalogue ids no rule produces yet, with the reason."""


def diagnose(m: Measurements) -> list[Finding]:
    """Every always-on rule over ``m``, ranked.

    Args:
        m: one run's measurements (a watch or a doctor run).

    Returns:
        The findings of every rule, ranked by :func:`redline.core.rank` (largest ceiling
        speedup first); empty when no rule fires.
    """
    return rank([f for rule in RULES.values() for f in rule(m)])


def diagnose_ranks(r: RanksReport) -> list[Finding]:
    """Every rule over the ranks of a multi-process job.

    Args:
        r: the job's per-rank report.

    Returns:
        The findings of every rank rule, in rule order (not ranked); empty when none fires.
    """
    return [f for rule in RANK_RULES.values() for f in rule(r)]
