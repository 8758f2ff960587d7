"""The rule registry: one function per finding id, run over the measurements of a watch or
over a trace analysis, and the findings ranked by the gain they promise.

Every id of :data:`redline.core.findings.CATALOGUE` has a rule here, or is listed in
:data:`NOT_DIAGNOSED` with the reason (a test holds this).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from redline.core.findings import Finding, rank
from redline.core.measurements import Measurements
from redline.core.report import RanksReport
from redline.diagnose import data, ddp, device, evaluation, host, loop, ranks, trace_rules
from redline.trace.analyze import RankAnalysis, TraceAnalysis

Rule = Callable[[Measurements], list[Finding]]
TraceRule = Callable[[RankAnalysis], list[Finding]]
JobRule = Callable[[TraceAnalysis], list[Finding]]
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

TRACE_RULES: dict[str, TraceRule] = {
    "launch_bound": trace_rules.launch_bound,
    "memory_bound_kernels": trace_rules.memory_bound_kernels,
    "fp32_matmul_on_tensor_cores": trace_rules.fp32_matmul_on_tensor_cores,
    "unfused_attention": trace_rules.unfused_attention,
    "comm_not_overlapped": trace_rules.comm_not_overlapped,
    "host_sync": trace_rules.host_sync,
    "h2d_copy": trace_rules.h2d_copy,
}
"""Rules over one rank's trace analysis."""

JOB_RULES: dict[str, JobRule] = {
    "straggler": trace_rules.straggler,
}
"""Rules over all ranks' traces of one job."""

RANK_RULES: dict[str, RanksRule] = {
    "straggler": ranks.straggler,
}
"""Rules over the merged ranks of a multi-process watch."""

NOT_DIAGNOSED: dict[str, str] = {}
"""Catalogue ids no rule produces yet, with the reason."""


def diagnose(m: Measurements) -> list[Finding]:
    """Every always-on rule over ``m``, ranked."""
    return rank([f for rule in RULES.values() for f in rule(m)])


def diagnose_trace(a: TraceAnalysis) -> list[Finding]:
    """Every trace rule over each rank with device events, and the job rules, ranked; with
    more than one rank, each rank's findings name their rank."""
    several = len(a.ranks) > 1
    found = [dataclasses.replace(f, rank=r.rank) if several and f.rank is None else f
             for r in a.ranks if r.temporal is not None
             for rule in TRACE_RULES.values() for f in rule(r)]
    found += [f for rule in JOB_RULES.values() for f in rule(a)]
    return rank(found)


def diagnose_ranks(r: RanksReport) -> list[Finding]:
    """Every rule over the ranks of a multi-process job."""
    return [f for rule in RANK_RULES.values() for f in rule(r)]
