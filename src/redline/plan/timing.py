"""Time per optimizer step of a layout: compute from FLOPs at an assumed MFU, the pipeline
bubble, and each communication with whether it overlaps compute.

- FLOPs per sequence: ``6·Ψ·s + 12·L·h·s²`` (forward 2·Ψ·s + 4·L·h·s², backward twice that;
  Ultra-Scale Playbook A2, "more accurate" form); full recompute adds a forward, selective the
  attention core's forward (``4·L·h·s²``).
- Compute: FLOPs ÷ (GPUs × peak × MFU); the MFU is an assumption (default 0.40: llm-analysis
  suggests ~0.5 for large-model training; Korthikanti et al. report 54 % at 530B with every
  trick; smaller jobs reach less).
- Pipeline bubble: ``(p − 1)/(m + p − 1)`` of the step for m micro-batches per step (1F1B);
  ``(p − 1)/(v·m + p − 1)`` with v interleaved chunks per GPU, whose sends grow v-fold
  (Ultra-Scale Playbook; Narayanan et al., SC21).
- Data-parallel gradient all-reduce: ``2(n − 1)/n · S / B`` for S bytes of gradients per GPU
  (ring all-reduce; nccl-tests PERFORMANCE.md), once per step, overlapping the last
  micro-batch's backward; ZeRO-3 all-gathers the parameters in forward and backward of every
  micro-batch and reduce-scatters once: 1.5 × the DP volume per micro-batch of gathering, and
  it overlaps the whole forward and backward (the playbook's overlap conditions, A3).
- Tensor parallelism: 4 all-reduces (or all-gather + reduce-scatter with SP, the same volume)
  of ``s·b·h`` 16-bit activations per layer and micro-batch (6 with full recompute), not
  overlapped (the playbook: TP communication cannot easily be hidden).
- Pipeline: a ``s·b·h`` send forward and one backward per micro-batch and stage boundary,
  hidden when ``peak_flops / (32·h·layers_next·B) ≤ 1`` (playbook A3).
- Offload: the gradient shard to the host and the updated 16-bit parameters back over PCIe
  each step (the host's optimizer step itself is not modelled).

Bandwidths are the links' rates × the cluster's bus efficiency (0.8 by default, see
:data:`redline.plan.hardware.BUS_EFFICIENCY`). Where a group spans nodes its bandwidth is the
inter-node one: TP innermost (within a node when
t ≤ GPUs per node), then DP, then PP (Megatron's rank order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redline.plan.hardware import Cluster
from redline.plan.memory import Layout, Training, bytes_per_parameter
from redline.plan.spec import ModelSpec

DEFAULT_MFU = 0.40
"""Model FLOPs utilization assumed for compute time (see the module docstring)."""


@dataclass(slots=True, kw_only=True)
class Timing:
    """One step of a layout, in seconds (exposed = not hidden behind compute)."""

    flops_per_step: float
    compute_s: float
    """FLOPs ÷ (GPUs × peak × MFU), without the bubble."""
    bubble_fraction: float
    dp_comm_s: float
    dp_exposed_s: float
    tp_comm_s: float
    pp_comm_s: float
    pp_exposed_s: float
    offload_s: float
    step_s: float
    tokens_per_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def comm_exposed_s(self) -> float:
        return self.dp_exposed_s + self.tp_comm_s + self.pp_exposed_s + self.offload_s


def flops_per_step(spec: ModelSpec, tr: Training, recompute: str = "none") -> float:
    s = tr.seq or spec.seq or 1
    attn = 4 * spec.layers * spec.hidden * s * s if spec.layers and spec.hidden else 0.0
    fwd = 2 * spec.params * s + attn
    extra = fwd if recompute == "full" else attn if recompute == "selective" else 0.0
    return tr.global_batch * (3 * fwd + extra)


def _bw(cl: Cluster, span_gpus: int) -> float:
    """Bus bandwidth of a group that spans ``span_gpus`` consecutive ranks."""
    link = cl.intra_node_bytes_per_s if span_gpus <= cl.gpus_per_node else \
        cl.inter_node_bytes_per_s
    return link * cl.bus_efficiency


def step_time(spec: ModelSpec, tr: Training, cl: Cluster, lay: Layout,
              mfu: float = DEFAULT_MFU) -> Timing:
    """Predicted time of one optimizer step of ``spec`` on ``cl`` in layout ``lay``: compute
    (FLOPs ÷ (GPUs × peak × ``mfu``)) stretched by the pipeline bubble, plus the exposed
    data-parallel, tensor-parallel, pipeline and offload communication.

    Args:
        spec: the model.
        tr: the training (global batch, precision, sequence length).
        cl: the cluster (peak FLOP/s, link bandwidths).
        lay: the layout.
        mfu: the model FLOPs utilization assumed, a fraction of the peak.

    Returns:
        The :class:`Timing`: FLOPs per step, each part in seconds, the bubble fraction, the
        step time (s), tokens/s, and notes on what is not modelled.
    """
    s = tr.seq or spec.seq or 1
    m = max(1, tr.global_batch // (lay.dp * lay.micro_batch))
    p_b, g_b, _, _ = bytes_per_parameter(tr)
    notes: list[str] = []
    fl = flops_per_step(spec, tr, lay.recompute)
    compute = fl / (lay.gpus * cl.peak_flops * mfu)
    v = lay.virtual_stages
    bubble = (lay.pp - 1) / (v * m + lay.pp - 1) if lay.pp > 1 else 0.0
    busy = compute / (1 - bubble)
    psi = spec.params / (lay.tp * lay.pp)
    n = lay.dp
    dp_bw = _bw(cl, lay.tp * lay.dp)
    ring = 2 * (n - 1) / n if n > 1 else 0.0
    if lay.zero >= 3:
        gather = m * 2 * p_b * psi * (n - 1) / n  # all-gather in forward and in backward
        scatter = g_b * psi * (n - 1) / n
        dp = (gather + scatter) / dp_bw if n > 1 else 0.0
        dp_exposed = max(0.0, dp - compute)
    else:
        dp = ring * g_b * psi / dp_bw
        window = compute * 2 / 3 / m  # the last micro-batch's backward
        dp_exposed = max(0.0, dp - window)
    tp = 0.0
    if lay.tp > 1 and spec.layers and spec.hidden:
        per = 6 if lay.recompute == "full" else 4
        vol = m * (spec.layers / lay.pp) * per * 2 * (lay.tp - 1) / lay.tp * \
            s * lay.micro_batch * spec.hidden * 2
        tp = vol / _bw(cl, lay.tp)
        if lay.tp > cl.gpus_per_node:
            notes.append(f"TP {lay.tp} spans nodes: its all-reduces leave NVLink")
    elif lay.tp > 1:
        notes.append("TP communication unknown without the model's hidden size and layers")
    pp = pp_exposed = 0.0
    if lay.pp > 1 and spec.hidden and spec.layers:
        bw = _bw(cl, lay.gpus)  # stages are the outermost groups: across nodes when big
        pp = v * m * 2 * s * lay.micro_batch * spec.hidden * 2 / bw
        layers_next = spec.layers / (lay.pp * v)
        if cl.peak_flops / (32 * spec.hidden * layers_next * bw) > 1:
            pp_exposed = pp
    offload = 0.0
    if lay.offload:
        offload = (g_b + p_b) * psi / max(1, n if lay.zero >= 1 else 1) / cl.pcie_bytes_per_s
        notes.append("the host's optimizer step is not modelled (only the PCIe transfers)")
    step = busy + dp_exposed + tp + pp_exposed + offload
    return Timing(flops_per_step=fl, compute_s=compute, bubble_fraction=bubble, dp_comm_s=dp,
                  dp_exposed_s=dp_exposed, tp_comm_s=tp, pp_comm_s=pp, pp_exposed_s=pp_exposed,
                  offload_s=offload, step_s=step,
                  tokens_per_s=tr.global_batch * s / step, notes=notes)
