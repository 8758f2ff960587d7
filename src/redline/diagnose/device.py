"""Device-side findings from always-on data: host_sync, small_batch, no_mixed_precision,
fp32_matmul_on_tensor_cores. (The trace-based rules are in :mod:`redline.diagnose.trace_rules`.)"""

from __future__ import annotations

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements
from redline.diagnose.thresholds import (
    CPU_MATMUL_BOUND_FRACTION,
    MIN_COMPUTE_FRACTION,
    MIN_CPU_BF16_CEILING,
    SMALL_BATCH_MAX_BUSY,
    SMALL_BATCH_MAX_MEMORY_FRACTION,
    SMALL_BATCH_MIN_FIXED_FRACTION,
    SMALL_BATCH_PROJECTED_FACTOR,
)
from redline.measure.peaks import peak_flops


def _cc(m: Measurements) -> float:
    return float(m.device.compute_capability) if m.device.compute_capability else 0.0


def _compute_fraction(m: Measurements) -> float | None:
    """Share of the step in which the device computes: the CUDA-event span on GPU, the
    forward+backward+optimizer host share on CPU (where host time is compute time)."""
    if m.device.type == "cuda":
        return m.device_metrics.device_span_fraction
    return sum(m.fraction(p) for p in ("forward", "backward", "optimizer"))


def host_sync(m: Measurements) -> list[Finding]:
    dm = m.device_metrics
    if not dm.sync_calls or dm.sync_calls_per_step is None:
        return []
    sites = "; ".join(f"{s['site']} ×{s['count']}" for s in dm.sync_sites[:3])
    span = dm.device_span_fraction
    return [Finding(
        id="host_sync", severity="medium" if dm.sync_calls_per_step >= 1 else "low",
        title=f"{dm.sync_calls_per_step:.1f} synchronizing CUDA calls per step stall the host",
        evidence={"sync_calls": dm.sync_calls, "sync_calls_per_step": round(dm.sync_calls_per_step, 2),
         "top_sites": sites, "device_span_fraction": None if span is None else round(span, 3)},
        ceiling_speedup=None,
        fix=f"Remove host reads of device values from the loop ({sites}): .item(), .cpu(), "
        "print(tensor), bool(tensor), nonzero(); accumulate metrics on the device and read them "
        "every N steps. Their cost is not measurable without a kernel-level trace "
        "(torch.profiler with CUDA activities).")]


FIXED_PHASES = ("optimizer", "comm")
"""Phases whose time per step does not grow with the batch: the optimizer's update (one pass
over the parameters) and the loop's own collectives (gradient-sized, not batch-sized)."""

PER_SAMPLE_PHASES = ("data_wait", "h2d_copy", "forward", "backward")
"""Phases taken to grow with the batch. Forward and backward hold fixed costs of their own
(launches, weight reads): counting them all per sample understates the fixed part, so the
projected gain is a lower bound."""


def _amortization(m: Measurements) -> Finding | None:
    """Per-step costs that do not grow with the batch make ≥ SMALL_BATCH_MIN_FIXED_FRACTION of
    the step: the optimizer step, the loop's collectives and the optimizer's helpers outside
    the phases (zero_grad, clipping: the stack sampler's 'optimizer' kind). Other host work
    outside the phases has findings of its own and is left out; evaluation does not scale
    with the training batch either way."""
    step = m.timing.step_time_mean_s
    if step is None or step <= 0:
        return None
    dm = m.device_metrics
    if m.device.type == "cuda" and (dm.device_span_fraction is None
                                    or dm.device_span_fraction >= SMALL_BATCH_MAX_BUSY):
        return None  # host time hidden under a busy device is not what the step waits for
    loop = m.loop  # the stack sampler's attribution, where it ran
    kinds: dict[str, float] = loop.kind_fractions if loop is not None else {}
    helpers = kinds.get("optimizer", 0.0)
    fixed_f = sum(m.fraction(p) for p in FIXED_PHASES) + helpers
    if fixed_f < SMALL_BATCH_MIN_FIXED_FRACTION:
        return None
    var_f = sum(m.fraction(p) for p in PER_SAMPLE_PHASES)
    fixed_s, var_s = fixed_f * step, var_f * step
    samples = m.timing.samples_per_step or (float(m.config.batch_size)
                                            if m.config.batch_size else None)
    k = SMALL_BATCH_PROJECTED_FACTOR
    # per sample at k× the batch, everything but the fixed part taken to grow with it (other
    # host work and evaluation included, the cautious side): (fixed + k·rest) ÷ (k·samples)
    gain = (step * k) / (fixed_s + k * (step - fixed_s))
    opt_s = m.fraction("optimizer") * step
    # accumulating k micro-batches per optimizer step amortizes only the optimizer's update
    gain_acc = step / (step - opt_s * (1 - 1 / k))
    per_sample = var_s / samples if samples else None
    ev: Evidence = {
        "fixed_ms_per_step": round(fixed_s * 1e3, 3),
        "fixed_fraction": round(fixed_f, 4),
        "optimizer_ms_per_step": round(opt_s * 1e3, 3),
        "comm_ms_per_step": round(m.fraction("comm") * step * 1e3, 3),
        "optimizer_helpers_ms_per_step": round(helpers * step * 1e3, 3),
        "per_sample_ms": None if per_sample is None else round(per_sample * 1e3, 4),
        "per_sample_basis": "(data_wait + h2d_copy + forward + backward) ÷ samples per step",
        "samples_per_step": samples,
        "batch_size": m.config.batch_size,
        "step_ms": round(step * 1e3, 3),
        f"projected_throughput_gain_at_{k}x_batch": round(gain, 3),
        f"projected_gain_accumulating_{k}_microbatches": round(gain_acc, 3),
    }
    if m.device.type == "cuda":
        ev["device_span_fraction"] = dm.device_span_fraction
    if dm.peak_reserved_bytes is not None and dm.total_memory_bytes:
        ev["peak_reserved_fraction"] = round(dm.peak_reserved_bytes / dm.total_memory_bytes, 3)
    bs = m.config.batch_size
    parts = (f"{fixed_s * 1e3:.1f} ms fixed per step" + (f" + {per_sample * 1e3:.3f} ms per sample"
                                                          if per_sample is not None else ""))
    return Finding(
        id="small_batch", severity=severity_for(1.0 - 1.0 / gain),
        title=f"Per-step costs that do not grow with the batch make {fixed_f:.0%} of the step "
        f"({parts})",
        evidence=ev, ceiling_speedup=ceiling_speedup(fixed_f),
        fix=f"Raise the batch size ({'from ' + str(bs) + ' ' if bs else ''}to {k}× projects "
        f"{gain:.2f}× the samples per second, the optimizer's {opt_s * 1e3:.1f} ms then spread "
        f"over {k}× the samples) and scale the learning rate with it (linear for SGD, square "
        "root for Adam-family optimizers, with warm-up); `redline tune --allow-batch-change` "
        "finds the size that fits and checks the loss. Where memory binds, accumulate "
        f"gradients over {k} micro-batches: one optimizer step per {k} "
        f"({gain_acc:.2f}× projected).")


def small_batch(m: Measurements) -> list[Finding]:
    """Per-step costs that do not grow with the batch dominate the step (any device), or, on
    CUDA, the batch leaves most of the device's memory free while the device idles."""
    amort = _amortization(m)
    mem_f = _memory_headroom(m)
    if amort is None:
        return [] if mem_f is None else [mem_f]
    return [amort]


def _memory_headroom(m: Measurements) -> Finding | None:
    dm = m.device_metrics
    if (m.device.type != "cuda" or dm.peak_reserved_bytes is None or not dm.total_memory_bytes
            or dm.device_span_fraction is None):
        return None
    mem = dm.peak_reserved_bytes / dm.total_memory_bytes
    span = dm.device_span_fraction
    # The device idles while the loop waits for its next batch: a larger batch does not make
    # the input come faster (data_starvation names that time), so only the idle time the
    # data wait does not explain is the per-step overhead a larger batch amortizes.
    data_wait = m.fraction("data_wait")
    idle = max(0.0, 1.0 - span - data_wait)
    if mem >= SMALL_BATCH_MAX_MEMORY_FRACTION or 1.0 - idle >= SMALL_BATCH_MAX_BUSY:
        return None
    return Finding(
        id="small_batch", severity="medium",
        title=f"The batch uses {mem:.0%} of device memory and the device idles {idle:.0%} of "
              "the step for reasons other than waiting for data",
        evidence={"peak_reserved_fraction": round(mem, 3), "device_span_fraction": round(span, 3),
         "data_wait_fraction": round(data_wait, 3), "idle_not_data_fraction": round(idle, 3),
         "batch_size": m.config.batch_size},
        ceiling_speedup=ceiling_speedup(idle),
        fix="Raise the batch size towards the memory limit (keep the effective batch with gradient "
        "accumulation if the optimization must not change); per-step overheads then amortize.")


def _peak_ratio(m: Measurements, slow: str, fast: str) -> float | None:
    a, b = peak_flops(m.device.name, slow), peak_flops(m.device.name, fast)
    if a is None or b is None:
        return None
    return a[0] / b[0]


def _cpu_gemm_share(m: Measurements) -> float | None:
    """Share of the step spent in matrix products on a CPU: the step's counted FLOP/s ÷ the
    CPU's measured fp32 product rate on the same threads (capped at the compute share, which
    holds them); None where either is unknown."""
    rate, achieved = m.host.gemm_fp32_flops_per_s, m.mfu.achieved_flops_per_s
    comp = _compute_fraction(m)
    if not rate or achieved is None or comp is None:
        return None
    return min(comp, achieved / rate)


def no_mixed_precision(m: Measurements) -> list[Finding]:
    eff = m.precision.effective
    if eff not in ("fp32", "tf32"):
        return []
    on_cuda = m.device.type == "cuda" and _cc(m) >= 7.0
    on_amx = m.device.type == "cpu" and "amx_bf16" in m.host.cpu_flags
    if not (on_cuda or on_amx):
        return []
    low = "bf16" if (m.device.type == "cpu" or _cc(m) >= 8.0) else "fp16"
    comp = _compute_fraction(m)
    if comp is None or comp < MIN_COMPUTE_FRACTION:
        return []  # compute is not where the time goes: precision is not the lever yet
    evidence: Evidence = {"precision": eff, "compute_fraction": round(comp, 3)}
    severity = None
    unknown = ""
    if on_cuda:
        ratio = _peak_ratio(m, eff, low)
        # Amdahl: the compute share runs at most peak(low)/peak(eff) times faster.
        ceiling = ceiling_speedup(comp * (1.0 - ratio)) if ratio is not None else None
        evidence[f"peak_{eff}_over_{low}"] = None if ratio is None else round(ratio, 4)
        evidence["compute_capability"] = m.device.compute_capability
    else:
        # Only the matrix products gain from AMX, at the rate this CPU measured for them.
        share = _cpu_gemm_share(m)
        fp32, bf16 = m.host.gemm_fp32_flops_per_s, m.host.gemm_bf16_flops_per_s
        ratio = fp32 / bf16 if fp32 and bf16 else None
        ceiling = (ceiling_speedup(share * max(0.0, 1.0 - ratio))
                   if share is not None and ratio is not None else None)
        evidence.update({
            "matmul_fraction": None if share is None else round(share, 3),
            "achieved_flops_per_s": m.mfu.achieved_flops_per_s,
            "cpu_gemm_fp32_flops_per_s": fp32, "cpu_gemm_bf16_flops_per_s": bf16,
            "measured_fp32_over_bf16": None if ratio is None else round(ratio, 4)})
        if m.mfu.achieved_flops_per_s == 0:
            return []  # FLOPs counted, none of them in matrix products: nothing to speed up
        if ceiling is not None and ceiling < MIN_CPU_BF16_CEILING:
            return []
        if ceiling is None or share is None or share < CPU_MATMUL_BOUND_FRACTION:
            # The products' share is unknown, or too small to be sure AMX gains more than
            # autocast's casts cost: said, at low severity, with no ceiling (the probe's
            # large-product gain is not what small products get, so the Amdahl bound would
            # rank a guess above measured findings).
            severity, ceiling = "low", None
            evidence["gain_unknown"] = True
            why = ("redline did not count the step's FLOPs, so it cannot tell"
                   if m.mfu.achieved_flops_per_s is None else
                   "this CPU's matrix-product rates were not measured (see the report's "
                   "notes), so redline cannot tell" if share is None else
                   f"the step's FLOPs run at {share:.0%} of this CPU's fp32 rate for a large "
                   "matrix product, too little to tell")
            unknown = (f" Whether it pays is unknown here: {why} a step of large matrix "
                       "products (which AMX runs several times faster in bf16) from one of "
                       "small layers (which may gain nothing); time a few steps both ways.")
    if severity is None:
        severity = "high" if ceiling and ceiling >= 1.5 else "medium"
    amp = ("torch.autocast('cuda', dtype=torch.bfloat16)" if low == "bf16" and on_cuda else
           "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler()" if on_cuda
           else "torch.autocast('cpu', dtype=torch.bfloat16)")
    return [Finding(
        id="no_mixed_precision", severity=severity,
        title=f"Training runs in {eff} on a device with {low} matrix units",
        evidence=evidence,
        ceiling_speedup=ceiling,
        fix=f"Run forward and loss under {amp}; keep the optimizer in fp32. Compare loss and "
        "gradient norm with an fp32 run from the same weights for a few hundred steps before "
        "keeping it." + unknown)]


def fp32_matmul_on_tensor_cores(m: Measurements) -> list[Finding]:
    if m.device.type != "cuda" or _cc(m) < 8.0 or m.precision.effective != "fp32":
        return []
    comp = _compute_fraction(m)
    if comp is None or comp < MIN_COMPUTE_FRACTION:
        return []
    ratio = _peak_ratio(m, "fp32", "tf32")
    ceiling = ceiling_speedup(comp * (1.0 - ratio)) if comp is not None and ratio else None
    return [Finding(
        id="fp32_matmul_on_tensor_cores", severity="medium",
        title="fp32 matmuls run without TF32 on an Ampere-or-newer GPU",
        evidence={"float32_matmul_precision": m.precision.float32_matmul_precision,
         "compute_capability": m.device.compute_capability,
         "peak_fp32_over_tf32": None if ratio is None else round(ratio, 4)},
        ceiling_speedup=ceiling,
        fix="torch.set_float32_matmul_precision('high') (TF32 matmuls, 10-bit mantissa inputs) — "
        "one line, no other code change.")]
