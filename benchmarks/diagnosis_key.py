"""Answer key of the diagnosis benchmark (``benchmarks/diagnosis.py``), written before any run.

One :class:`JobKey` per script in ``benchmarks/diagnosis_jobs/``: the one cause injected into
it, as a class, and which report entries count as naming it.

- ``accepted_ids``: redline finding ids any one of which counts as *detected* (for a key with
  ``rank`` set, only a finding naming that rank counts).
- ``tolerated_ids`` / ``tolerated_classes``: findings that are true of the job but not its cause
  named specifically (the generic ``host_work_in_loop`` on a job whose host work is a
  checkpoint save; a periodic stall on a job that saves every 5 steps; data wait on the rank
  whose data is slow). They neither detect nor count as a false alarm. The ids are redline's,
  the classes are what a peer's label is mapped to (``diagnosis.py`` documents the mapping).
- every other finding of severity high or medium is a *false alarm*; on a control every
  high/medium finding is one.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Cause classes a job's injected cause (or a peer's label) is one of.
CLASSES: tuple[str, ...] = (
    "data", "storage", "host_logging", "checkpoint", "gc", "batches_in_loop", "evaluation",
    "contention", "small_batch", "ddp_unused", "straggler", "periodic", "host_work", "control",
)

#: Finding ids being added to redline alongside this benchmark (issue 25), beside
#: ``redline.core.findings.CATALOGUE``.
NEW_IDS: tuple[str, ...] = (
    "host_work_in_loop", "checkpoint_in_loop", "logging_in_loop", "gc_pauses",
    "batches_built_in_loop", "periodic_stall", "evaluation_in_loop",
)

DATA_IDS: tuple[str, ...] = ("data_starvation", "cpu_preprocessing", "fetch_wait")


@dataclass(frozen=True, kw_only=True)
class JobKey:
    """The injected cause of one benchmark job and what counts as naming it."""

    script: str
    """File name in ``benchmarks/diagnosis_jobs/``."""
    cause_class: str
    """One of :data:`CLASSES`."""
    cause: str
    """The injected cause in words."""
    accepted_ids: tuple[str, ...] = ()
    """redline finding ids that count as detected (empty for a control)."""
    rank: int | None = None
    """For a multi-rank job: the rank an accepted finding must name; None = any or none."""
    tolerated_ids: tuple[str, ...] = ()
    """redline ids true of the job but not specific to its cause: neither detected nor false."""
    tolerated_classes: tuple[str, ...] = ()
    """Peer label classes true of the job but not specific: neither detected nor false."""
    nproc: int = 1
    """Processes the job runs as (2 = a 2-rank gloo DDP job started by torchrun)."""
    busy_neighbour: bool = False
    """The harness runs an unrelated CPU-bound process beside the job for its whole run."""


KEY: tuple[JobKey, ...] = (
    JobKey(script="aug_workers0.py", cause_class="data",
           cause="heavy per-sample augmentation in __getitem__, num_workers=0",
           accepted_ids=DATA_IDS),
    JobKey(script="aug_workers2.py", cause_class="data",
           cause="heavy per-sample augmentation in __getitem__, num_workers=2",
           accepted_ids=DATA_IDS,
           # two workers and the training thread share 2 CPUs: they do contend with each other
           tolerated_ids=("cpu_contention", "thread_oversubscription"),
           tolerated_classes=("contention",)),
    JobKey(script="storage_latency.py", cause_class="storage",
           cause="each sample read from its own file with a 2 ms storage latency, off-CPU",
           accepted_ids=("storage_fetch", "data_starvation", "fetch_wait")),
    JobKey(script="slow_collate.py", cause_class="data",
           cause="a hand-written collate_fn tokenising and padding in pure Python",
           accepted_ids=DATA_IDS),
    JobKey(script="json_logging.py", cause_class="host_logging",
           cause="a JSON line of loss and per-parameter statistics each step, .item() on each",
           accepted_ids=("logging_in_loop", "host_sync"),
           tolerated_ids=("host_work_in_loop",), tolerated_classes=("host_work",)),
    JobKey(script="checkpoint_every5.py", cause_class="checkpoint",
           cause="torch.save of model + optimizer state every 5 steps",
           accepted_ids=("checkpoint_in_loop",),
           tolerated_ids=("host_work_in_loop", "periodic_stall"),
           tolerated_classes=("host_work", "periodic")),
    JobKey(script="gc_bookkeeping.py", cause_class="gc",
           cause="per-step Python bookkeeping records and gc.collect() each step",
           accepted_ids=("gc_pauses",),
           tolerated_ids=("host_work_in_loop",), tolerated_classes=("host_work",)),
    JobKey(script="batches_in_loop.py", cause_class="batches_in_loop",
           cause="batches built inside the loop from Python lists, no DataLoader",
           accepted_ids=("batches_built_in_loop",),
           tolerated_ids=("host_work_in_loop", "data_starvation"),
           tolerated_classes=("host_work", "data")),
    JobKey(script="eval_every10.py", cause_class="evaluation",
           cause="a validation pass (eval + no_grad, 30 batches) every 10 steps in the loop",
           accepted_ids=("evaluation_in_loop",),
           tolerated_ids=("host_work_in_loop", "periodic_stall"),
           tolerated_classes=("host_work", "periodic")),
    JobKey(script="child_cpu_burner.py", cause_class="contention",
           cause="the script starts two CPU-bound child processes that run beside training",
           accepted_ids=("cpu_contention",)),
    JobKey(script="busy_neighbour.py", cause_class="contention",
           cause="an unrelated CPU-bound process per CPU, started by the harness beside the job",
           accepted_ids=("cpu_contention",), busy_neighbour=True),
    JobKey(script="small_batch_adamw.py", cause_class="small_batch",
           cause="batch size 2 on a ~10 M-parameter MLP with AdamW (optimizer-dominated step)",
           accepted_ids=("small_batch",),
           tolerated_ids=("launch_bound",)),
    JobKey(script="ddp_unused.py", cause_class="ddp_unused",
           cause="2-rank gloo DDP with find_unused_parameters=True, every parameter used",
           accepted_ids=("unused_parameter_search",), nproc=2),
    JobKey(script="ddp_slow_rank1.py", cause_class="straggler",
           cause="2-rank DDP whose rank 1 loads each sample 3x slower",
           accepted_ids=("straggler",), rank=1, nproc=2,
           tolerated_ids=("data_starvation", "fetch_wait", "storage_fetch"),
           tolerated_classes=("data", "storage")),
    JobKey(script="periodic_stall.py", cause_class="periodic",
           cause="every 10th step blocks ~10x a normal step pushing metrics to a server",
           accepted_ids=("periodic_stall",),
           tolerated_ids=("host_work_in_loop",), tolerated_classes=("host_work",)),
    JobKey(script="host_metrics.py", cause_class="host_work",
           cause="per-step confusion matrix and per-class metrics in pure Python on the outputs",
           accepted_ids=("host_work_in_loop",),
           tolerated_ids=("host_sync",), tolerated_classes=("host_logging",)),
    JobKey(script="clean_mlp.py", cause_class="control",
           cause="none: compute-bound MLP, in-memory DataLoader",
           # Its fp32 products (batch 256, widths 512-1024) are large enough for AMX tiles: on
           # a CPU with amx_bf16 (Sapphire Rapids, 2026-12-05) its model and batch ran 2.65x as
           # fast under bf16 autocast, so there the precision finding is true of it (the
           # host's, not an injected cause; benchmarks/cpu_bf16.py's 512->1024x3 rows agree).
           tolerated_ids=("no_mixed_precision",)),
    JobKey(script="clean_cnn.py", cause_class="control",
           cause="none: compute-bound small CNN, in-memory DataLoader"),
    JobKey(script="clean_ddp.py", cause_class="control",
           cause="none: balanced 2-rank gloo DDP MLP", nproc=2),
)

BY_SCRIPT: dict[str, JobKey] = {k.script.removesuffix(".py"): k for k in KEY}
"""Job name (the script's stem) -> its key."""
