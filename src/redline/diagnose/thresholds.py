"""Every threshold of the rules, each with its source.

The always-on rules (:mod:`~redline.diagnose.data`, :mod:`~redline.diagnose.host`,
:mod:`~redline.diagnose.device`), the trace rules (:mod:`~redline.diagnose.trace_rules`), the
stall note (:mod:`~redline.diagnose.stall`) and the limits left after tuning
(:mod:`~redline.diagnose.limits`) read them from here and nowhere else.
"""

DATA_WAIT_MIN_FRACTION = 0.05
"""Data wait ≥ 5 % of step time → data_starvation. The PyTorch TensorBoard profiler plugin's
rule 'DataLoader time ÷ step time > 5 %' (``torch_tb_profiler``, its input-pipeline
recommendation)."""

CPU_BOUND_MIN_FRACTION = 0.5
"""A fetch is CPU work when the CPU it burned is ≥ half its wall time; below that the fetcher
mostly waited (storage, network, sleep). The split is redline's own: CPU time against wall time
of the same fetches, the measurable side of DS-Analyzer's fetch-vs-preprocess split (Mohan et
al., "Analyzing and Mitigating Data Stalls in DNN Training", VLDB 2021)."""

READS_EVIDENCE_BYTES_PER_S = 100_000
"""A fetch that waits off-CPU is claimed to wait on storage only when the process and its
workers read at least 100 kB/s (/proc/<pid>/io read_bytes, or read() bytes where page-cache
hits or a network file system serve them): below that, what the fetch waits on is not its
reads (a socket, a lock, a sleep), and the finding says so instead (``fetch_wait``)."""

OTHERS_MIN_CORES = 0.25
"""Other processes count as the competing load when they keep ≥ a quarter of a core busy on
the job's CPUs during the window; below that, run delay comes from the job's own threads."""

MAIN_THREAD_RUN_DELAY_MIN_FRACTION = 0.2
"""The training thread runnable but without a CPU ≥ 20 % of the measured window (its scheduler
run delay, /proc/self/task/<tid>/schedstat) → cpu_contention over the whole step, when other
processes use ≥ OTHERS_MIN_CORES of the job's CPUs. Run-queue latency is the USE method's
measure of CPU saturation (Gregg, "Systems Performance", 2nd ed., the USE method for CPUs).
A fifth of the step is a ceiling of 1.25×: set high so that a shared host's ordinary run-queue
latency stays below it, while one CPU-bound process sharing the loop's CPU (CFS splits the CPU
between them: ≈ 50 %) is well above it."""

SECONDARY_MIN_SHARE = 0.3
"""The minor side of the split is reported too when it makes ≥ 30 % of the data wait (and
≥ 5 % of the step): a mixed pipeline needs both fixes."""

CPUS_SATURATED = 0.9
"""The usable CPUs count as saturated at ≥ 90 % busy (training process + workers): more
workers would only compete for them."""

H2D_MIN_FRACTION = 0.05
"""Host→device copies ≥ 5 % of step time (same order as the data-wait rule)."""

SMALL_BATCH_MAX_MEMORY_FRACTION = 0.5
"""Peak reserved memory < 50 % of the device and the device not kept busy → room for a larger
batch (the TensorBoard profiler plugin's 'GPU utilization < 0.5 → increase batch size' rule,
read as memory headroom)."""

SMALL_BATCH_MAX_BUSY = 0.8
"""Device span below 80 % of step time. NVIDIA DCGM documents SM activity ≥ 0.8 as necessary
for effective use of the GPU (DCGM user guide, profiling metrics, ``DCGM_FI_PROF_SM_ACTIVE``)."""

SMALL_BATCH_MIN_FIXED_FRACTION = 0.5
"""Per-step costs that do not grow with the batch (the optimizer step, the loop's collectives,
the optimizer's helpers) ≥ half the step → small_batch on any device. Amdahl on the fixed share
φ: a k× batch runs φ/k + (1 − φ) of the time per sample, so from φ = 0.5 on a 4× batch gives
≥ 1.6× the throughput and the ceiling (k → ∞) is ≥ 2×; below it the gain is the per-sample
work's, which a larger batch does not remove."""

SMALL_BATCH_PROJECTED_FACTOR = 4
"""The larger batch the projection is stated for (k×): a step of the usual powers of two,
within the 8× that ``redline tune --allow-batch-change`` tries at most."""

WORKER_RESPAWN_MIN_FRACTION = 0.01
"""Worker start-up ≥ 1 % of the measured wall time is worth ``persistent_workers=True``."""

EVALUATION_MIN_FRACTION = 0.05
"""Evaluation inside the training loop ≥ 5 % of the measured step time → evaluation_in_loop:
the materiality of the data-wait rule (the TensorBoard profiler plugin's 5 % rule), applied to
another share of the step that is not training."""

HOST_WORK_MIN_FRACTION = 0.05
"""A recognised kind of host work between the phases (checkpoint saves, logging and host reads
of values, garbage collection, batches assembled in the loop) ≥ 5 % of the measured step time
→ its finding: the materiality of the data-wait rule (the TensorBoard profiler plugin's 5 %
rule), since on an accelerator each is a stretch where the device waits for the host."""

HOST_CODE_MIN_FRACTION = 0.10
"""Other code between the phases (no recognisable kind) ≥ 10 % of the step →
``host_work_in_loop`` naming its lines. Twice the bar of a recognised kind: every loop spends
some time outside the phases (zero_grad, moving tensors, Python between calls), and only a share
this large is worth reading code for."""

LOOP_NAMING_MIN_SAMPLES = 3
"""Stack samples outside the phases below which their lines and kinds are not named: the time
there is then told as a whole (``host_work_in_loop``, no line). A sample lands where the loop
lets the GIL go, not uniformly in time, and one or two of them would hand the whole share to
the line they fell on (a pure-Python batch builder of 2 ms steps, 91 % of each step outside the
phases, gave one sample on its loss line and no finding at all)."""

PERIODIC_MIN_FRACTION = 0.05
"""Every k-th step slower, the extra time ≥ 5 % of the measured step time → ``periodic_stall``
(same materiality as the other host findings)."""

MIN_COMPUTE_FRACTION = 0.3
"""Precision findings need the device to compute ≥ 30 % of the step; below that, faster math
changes little (Amdahl) and the data or host findings come first (the path's order)."""

MIN_CPU_BF16_CEILING = 1.10
"""On a CPU with AMX, no_mixed_precision needs its Amdahl ceiling (the step's matrix-product
share sped up by the CPU's measured fp32 ÷ bf16 rate) to reach 1.10× to be said at all."""

CPU_MATMUL_BOUND_FRACTION = 0.5
"""On a CPU with AMX, no_mixed_precision is medium or high only where the step's counted FLOPs
run at ≥ half of the CPU's measured fp32 rate for a large matrix product (its products are
large and make most of the step); below, low ("time it"). Autocast casts every weight and
activation it converts, and small products gain little from the tiles: in
``benchmarks/cpu_bf16.py`` (MLPs of 2–4 layers, widths 128–2048, batches 32–512, Adam, 1 and 2
threads, on a Sapphire Rapids CPU, 2026-12-05) bf16 autocast ran 0.73–1.14× as fast at shares
0.13–0.43 (one 1.28×), and 1.38–2.20× at shares 0.53–0.67; the diagnosis benchmark's small CNN,
at 0.38–0.42, ran 1.76–1.93× as fast (its convolutions run below the product rate, so its share
reads low), which a low finding still names."""

# -- trace rules ------------------------------------------------------------------------------

TRACE_SHARE_MIN = 0.05
"""A trace finding needs ≥ 5 % of the traced window at stake."""

PAGEABLE_H2D_MIN_FRACTION = 0.01
"""Host→device copies from pageable memory are reported from 1 % of the window: each blocks
the host until it is done (CUDA programming guide, "Page-Locked Host Memory"), a cost beyond
the copy's own time, and pinning is a one-line fix."""

COMM_EXPOSED_MIN_FRACTION = 0.10
"""Exposed communication ≥ 10 % of the window (the TensorBoard profiler plugin's rule
'communication ÷ step > 10 %')."""

SHORT_KERNELS_MIN_FRACTION = 0.5
"""launch_bound needs at least half the kernels to run shorter than the CPU call that
launched them (Holistic Trace Analysis's 'short GPU kernels' of its CUDA kernel launch
statistics)."""

MEMORY_BOUND_MIN_SHARE_OF_COMPUTE = 0.4
"""memory_bound_kernels needs elementwise / reduction / normalization kernels to take ≥ 40 %
of the compute time: below that, fusing them is not where the time goes."""

TF32_OVER_FP32_GEMM_SPEEDUP = 8.0
"""TF32 tensor cores run an fp32 GEMM at least 8× the SIMT fp32 rate on Ampere and Hopper
(A100: 156 vs 19.5 TFLOP/s; H100 SXM: 495 vs 67, NVIDIA datasheets)."""

STRAGGLER_MIN_SKEW = 0.05
"""A rank that arrives late at collectives by ≥ 5 % of the window (a trace) or keeps the others
waiting ≥ 5 % of the step (a multi-process watch) is reported."""

STRAGGLER_MIN_WAIT_S = 0.001
"""…and at least 1 ms per step: below that the others' wait is within what the host's scheduler
alone can cost a rank (Linux CFS preempts at a granularity of ~0.75 ms by default,
``sched_min_granularity_ns``), not a rank that does more than the others."""

STRAGGLER_MIN_LAST_SHARE = 0.75
"""A straggler arrives last at ≥ 75 % of the collectives: between balanced ranks the last
arrival moves from rank to rank (half the time each, for two), so a rank that is last three
times in four is late for a reason, not by chance."""

STRAGGLER_MIN_CAUSED_SHARE = 0.75
"""…or causes ≥ 75 % of all the waiting at collectives (the others' wait where it was last).
A job with many collectives per step (FSDP's per-layer all-gathers and reduce-scatters) has a
late rank at the first collective of each step and lockstep, order-by-chance arrivals at the
rest: the count of last arrivals then hides it, the time it makes the others wait does not."""

STRAGGLER_HELD_DELAY_SHARE = 0.8
"""A rank training on CPU whose training thread's extra run delay (runnable without a CPU,
/proc/<pid>/task/<tid>/schedstat) is ≥ 80 % of its extra compute was held off its CPUs: the
wall time a CPU-bound step adds is its extra CPU time plus its extra run delay, and here the
delay is (nearly) all of it."""

STRAGGLER_MORE_WORK_CPU_SHARE = 0.25
"""…otherwise, where ≥ 25 % of its extra compute shows as extra CPU time of its process, it has
work the others do not (on a loaded host its run delay stretches that work further, so the CPU
time is a part of the wall time, not all of it)."""

# -- the stall note and the limits left after tuning -----------------------------------------

HOST_GAP_MIN = 0.1
"""The CUDA-event span exceeds the kernel-union busy by ≥ 10 points of the step: the device
idles between kernels inside the step's own work, i.e. the host does not launch fast enough
(the span brackets the work, the union counts only kernels; docs/report.md)."""

DEVICE_BOUND_MIN_BUSY = 0.9
"""Kernels run ≥ 90 % of the step: the device is the bottleneck."""

# -- DDP knobs --------------------------------------------------------------------------------

DDP_DEFAULT_BUCKET_BYTES = 25 * 2**20
"""DistributedDataParallel's default ``bucket_cap_mb`` (25 MiB, ``torch.nn.parallel.distributed``)."""

DDP_SMALL_BUCKETS_MIN_COUNT = 8
"""Buckets capped below the default are worth a finding from 8 of them on: fewer all-reduces
per step than that cost little whatever their size."""

DDP_BUCKET_COPY_MIN_BYTES = 100 * 2**20
"""A second copy of the gradients is worth a finding from 100 MiB on (below that, the memory
and the copy are small beside activations)."""

# -- memory over time and step-time drift ----------------------------------------------------

MEMORY_TREND_MIN_Z = 3.0
"""A memory curve rises beyond its noise when its Mann–Kendall z is ≥ 3 (p < 0.003 two-sided;
Mann 1945, Kendall 1975): the test counts rising pairs, so a few jumps (an arena mapped, a cache
filled) do not make a trend, a steady climb does."""

MEMORY_GROWTH_MIN_BYTES = 16 * 2**20
"""…and its fitted growth over the measured window is ≥ 16 MiB: below that, the window's growth
is within what a steady process moves by (a pymalloc arena is 1 MiB, glibc's per-thread arenas
64 MiB of address space touched a page at a time; a CUDA allocator block is 2 MiB or 20 MiB)."""

MEMORY_GROWTH_MIN_FRACTION = 0.05
"""…and ≥ 5 % of its value where the window began: a process of 40 GiB moves by more than a
small one without leaking."""

MEMORY_NOISE_FACTOR = 4.0
"""…and ≥ 4× the samples' robust σ around the fitted line: a curve that steps up once and
scatters is not a steady growth."""

MEMORY_LATE_SLOPE_SHARE = 0.5
"""…and the slope over the last half of the window is ≥ half the whole window's: memory that
rises during warm-up and then plateaus (the caching allocator, pinned-memory pools, the
DataLoader's prefetch buffers) has a late slope near 0."""

MEMORY_HIGH_HOURS = 1.0
"""Severity of a growth by its projected time to the limit: < 1 h high (the job dies soon),
< 24 h medium (an overnight run dies), else low."""

MEMORY_MEDIUM_HOURS = 24.0

DRIFT_MIN_Z = 4.0
"""The step time trends up when the Mann–Kendall z of the steady steps' times is ≥ 4
(p < 10⁻⁴): a loaded host's bursts of contention move a short window's times together, so the
bar is set above the 3 of the memory curves."""

DRIFT_MIN_RISE_FRACTION = 0.3
"""…and the fitted line rises by ≥ 30 % of the median step over the window: a drift a user
sees in a step-time plot, large beside the ~10 % that a shared host's load moves a step by."""

DRIFT_NOISE_FACTOR = 1.0
"""…and the rise is ≥ 1 robust σ of the steps around the line (spread-aware: a noisy loop
needs a larger rise; a rise within one step's scatter is not what a step-time plot shows,
however significant the trend test finds it over many steps)."""

BIMODAL_MIN_RATIO = 1.5
"""Two step-time levels are named when the slow level's median is ≥ 1.5× the fast one's (a
chance stall of a loaded host makes a tail, not a level this far above)…"""

BIMODAL_MIN_SEPARATION = 3.0
"""…with Ashman's D ≥ 3 (D > 2 is a clean separation of two modes: Ashman, Bird & Zeki, AJ
1994; 3 leaves room for a loaded host's spread)…"""

BIMODAL_MIN_SHARE = 0.1
"""…each level holding ≥ 10 % of the steps (fewer slow steps are outliers: the stall note's
and ``periodic_stall``'s)…"""

BIMODAL_MIN_FRACTION = 0.05
"""…and the slow steps' time above the fast level ≥ 5 % of the total (the materiality of the
other host findings)."""

BIMODAL_INTERLEAVED = (0.2, 0.8)
"""The slow steps' share in the first half of the run must lie within these: levels that
alternate through the run. A step time that shifted once (all slow steps late) is a drift."""

CONTENTION_EXPLAINS_SHARE = 0.5
"""A drift is the host's, not the loop's, when the training thread's run delay per step (its
wait for a CPU) rose from the first third of the steps to the last by ≥ half the step time's
rise (``cpu_contention`` names the load)."""

BIMODAL_RANK_DELAY_MIN_FRACTION = 0.05
"""In a multi-process job, a rank's wait for a CPU counts toward explaining another rank's two
step-time levels only where it is ≥ 5 % of its own step (the materiality of the other
step-share rules): eight ranks of a node each waiting 2 % of their steps are not a contended
host, and their waits summed would explain away any level."""

BIMODAL_DELAY_SHARE = 0.5
"""Two step-time levels are the host's when the training loop's thread waited for a CPU over
the steps for ≥ half the time the slow level cost: on a shared host the loop runs at two
speeds, with a CPU and without one (measured on a 2-core host at a load of 3–9: the wait was
60–70 % of the slow level's cost, part of the rest lost out of the scheduler's sight), while a
level of the loop's own leaves most of its extra time unexplained by any wait."""
