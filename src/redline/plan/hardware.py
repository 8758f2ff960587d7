"""The cluster a plan is made for: GPU kind (memory, peak FLOP/s, links, power), how many, and
how many per node.

Link bandwidths are per GPU and per direction, from vendor datasheets; they are defaults a user
overrides with what the cluster measures (nccl-tests ``busbw``). Peak FLOP/s come from
:mod:`redline.measure.peaks` (one table for MFU and for planning).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from redline.measure.peaks import find_device
from redline.plan.limits import PlanInputError, positive, whole

GB = 1e9

BUS_EFFICIENCY = 0.8
"""Collectives reach about 80 % of a link's rate as bus bandwidth: A100 NVLink all-reduce 235
of 300 GB/s, AWS EFA "effective 340 Gbps" of 400 for all-reduce (both as collected by Stas
Bekman's ml-engineering; nccl-tests PERFORMANCE.md defines busbw)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuKind:
    """One GPU model's planning numbers."""

    name: str
    """As the peak table names it (``redline/data/peak_flops.json``)."""
    memory_bytes: int
    intra_node_bytes_per_s: float
    """Per GPU, per direction, to the other GPUs of its node (NVLink, Infinity Fabric or PCIe)."""
    inter_node_bytes_per_s: float
    """Per GPU, per direction, to other nodes (the node's NICs ÷ its GPUs)."""
    power_w: float | None
    """Board power limit (TDP): energy at it is an upper bound. None: not stated here."""
    source: str


GPU_KINDS: tuple[GpuKind, ...] = (
    GpuKind(name="NVIDIA H200 SXM", memory_bytes=int(141 * GB), intra_node_bytes_per_s=450e9,
            inter_node_bytes_per_s=50e9, power_w=700.0,
            source="NVIDIA H200 datasheet (141 GB, NVLink 900 GB/s bidirectional, up to 700 W); "
            "8 × 400 Gb/s NICs per 8-GPU node as in DGX H200"),
    GpuKind(name="NVIDIA H100 SXM", memory_bytes=int(80 * GB), intra_node_bytes_per_s=450e9,
            inter_node_bytes_per_s=50e9, power_w=700.0,
            source="NVIDIA H100 datasheet (SXM: 80 GB, NVLink 900 GB/s bidirectional, up to 700 W); "
            "DGX H100: 8 × ConnectX-7 400 Gb/s per 8 GPUs"),
    GpuKind(name="NVIDIA H100 PCIe", memory_bytes=int(80 * GB), intra_node_bytes_per_s=300e9,
            inter_node_bytes_per_s=25e9, power_w=350.0,
            source="NVIDIA H100 datasheet (PCIe: 80 GB, NVLink bridge 600 GB/s bidirectional, "
            "300–350 W); 200 Gb/s per GPU across nodes assumed"),
    GpuKind(name="NVIDIA A100 80GB", memory_bytes=int(80 * GB), intra_node_bytes_per_s=300e9,
            inter_node_bytes_per_s=25e9, power_w=400.0,
            source="NVIDIA A100 datasheet (SXM: 80 GB, NVLink 600 GB/s bidirectional, 400 W); "
            "DGX A100: 8 × 200 Gb/s HDR per 8 GPUs"),
    GpuKind(name="NVIDIA A100 40GB", memory_bytes=int(40 * GB), intra_node_bytes_per_s=300e9,
            inter_node_bytes_per_s=25e9, power_w=400.0,
            source="NVIDIA A100 datasheet (SXM: 40 GB, NVLink 600 GB/s bidirectional, 400 W); "
            "DGX A100: 8 × 200 Gb/s HDR per 8 GPUs"),
    GpuKind(name="NVIDIA L40S", memory_bytes=int(48 * GB), intra_node_bytes_per_s=32e9,
            inter_node_bytes_per_s=12.5e9, power_w=350.0,
            source="NVIDIA L40S datasheet (48 GB, PCIe Gen4 x16 64 GB/s bidirectional, 350 W); "
            "100 Gb/s per GPU across nodes assumed"),
    GpuKind(name="NVIDIA L4", memory_bytes=int(24 * GB), intra_node_bytes_per_s=32e9,
            inter_node_bytes_per_s=12.5e9, power_w=72.0,
            source="NVIDIA L4 datasheet (24 GB, PCIe Gen4 x16, 72 W); 100 Gb/s per GPU assumed"),
    GpuKind(name="NVIDIA V100 SXM2", memory_bytes=int(32 * GB), intra_node_bytes_per_s=150e9,
            inter_node_bytes_per_s=12.5e9, power_w=300.0,
            source="NVIDIA V100 datasheet (SXM2: 32 GB, NVLink 300 GB/s bidirectional, 300 W)"),
    GpuKind(name="AMD Instinct MI300X", memory_bytes=int(192 * GB), intra_node_bytes_per_s=448e9,
            inter_node_bytes_per_s=50e9, power_w=750.0,
            source="AMD MI300X datasheet (192 GB, Infinity Fabric 896 GB/s aggregate, 750 W); "
            "400 Gb/s per GPU across nodes assumed"),
)
"""GPUs with planning defaults (peak FLOP/s from the peak table)."""


def gpu_kind(name: str) -> GpuKind:
    """The kind whose name matches ``name`` ('H100', 'a100-80gb', 'NVIDIA H200'): every token
    of the peak table's match for it must appear.

    Args:
        name: a GPU name, in any case.

    Returns:
        The :class:`GpuKind` (memory, link bandwidths, power); a variant the planning table
        lacks gets the closest kind of its family.

    Raises:
        PlanInputError: no known kind matches ``name``.
    """
    entry = find_device(name)
    tokens = set(re.split(r"[^a-z0-9]+", name.lower()))
    if entry is not None:
        for k in GPU_KINDS:
            if k.name == entry.name:
                return k
        # The peak table knows a variant (H200 NVL) the planning table does not: the closest
        # kind of the same family.
        fam = entry.match[0]
        for k in GPU_KINDS:
            if fam in k.name.lower().split():
                return k
    for k in GPU_KINDS:
        if tokens and tokens <= set(re.split(r"[^a-z0-9]+", k.name.lower())):
            return k
    raise PlanInputError(
        f"unknown GPU {name!r}; known: {', '.join(k.name for k in GPU_KINDS)} (or give "
        "`memory_gb`, `peak_tflops` and the link bandwidths for another)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """The GPUs of the job."""

    gpus: int
    gpus_per_node: int
    gpu_name: str
    memory_bytes: int
    peak_flops: float
    """Dense peak FLOP/s per GPU at the training precision."""
    peak_source: str
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    power_w: float | None
    price_per_gpu_hour: float | None = None
    pcie_bytes_per_s: float = 25e9
    """Host ↔ GPU per direction, for CPU offload (PCIe Gen4 x16 sustains about 25 GB/s)."""
    bus_efficiency: float = BUS_EFFICIENCY
    """Share of a link's rate that collectives reach as bus bandwidth (nccl-tests' busbw)."""

    def __post_init__(self) -> None:
        whole("gpus", self.gpus, what="GPUs of the job")
        whole("gpus_per_node", self.gpus_per_node, what="GPUs per node")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise PlanInputError(
                f"`gpus` {self.gpus} is not a whole number of nodes of `gpus_per_node` "
                f"{self.gpus_per_node}; give a multiple of it, or fewer GPUs than one node")
        for n, v in (("memory_bytes", self.memory_bytes), ("peak_flops", self.peak_flops),
                     ("intra_node_bytes_per_s", self.intra_node_bytes_per_s),
                     ("inter_node_bytes_per_s", self.inter_node_bytes_per_s),
                     ("pcie_bytes_per_s", self.pcie_bytes_per_s)):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise PlanInputError(f"`{n}` must be a finite number > 0, got {v}")
        if not 0 < self.bus_efficiency <= 1:
            raise PlanInputError(f"`bus_efficiency` must be in (0, 1], got "
                                 f"{self.bus_efficiency}")

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


def cluster(gpus: int, gpu: str = "H100", *, gpus_per_node: int = 8,
            precision: str = "bf16", memory_gb: float | None = None,
            peak_tflops: float | None = None, intra_node_gbps: float | None = None,
            inter_node_gbps: float | None = None,
            price_per_gpu_hour: float | None = None) -> Cluster:
    """A cluster of ``gpus`` GPUs of a known kind, any number overridden (bandwidths in GB/s
    per GPU and direction). Every number must be finite, > 0 and within its limit
    (:data:`redline.plan.limits.LIMITS`).

    Args:
        gpus: GPUs of the job.
        gpu: the GPU kind's name ('H100', 'a100-80gb'; see :func:`gpu_kind`).
        gpus_per_node: GPUs per node (at most ``gpus`` are used).
        precision: the training precision whose dense peak is read ("bf16", "fp16", ...).
        memory_gb: GB (10⁹ bytes) of memory per GPU; None = the kind's.
        peak_tflops: dense peak TFLOP/s per GPU; None = the peak table's for ``precision``.
        intra_node_gbps: GB/s per GPU and direction within a node; None = the kind's.
        inter_node_gbps: GB/s per GPU and direction across nodes; None = the kind's.
        price_per_gpu_hour: price per GPU-hour (any currency); None = unknown (no cost).

    Returns:
        The :class:`Cluster`, in bytes, FLOP/s and bytes/s.

    Raises:
        PlanInputError: a number is not whole, finite, positive or within its limit; the GPU
            is unknown; or no peak is known for ``precision`` and none is given.
    """
    whole("gpus", gpus, what="GPUs of the job")
    whole("gpus_per_node", gpus_per_node, what="GPUs per node")
    for field, v, what in (("memory_gb", memory_gb, "GB of memory per GPU"),
                           ("peak_tflops", peak_tflops, "dense peak TFLOP/s per GPU"),
                           ("intra_node_gbps", intra_node_gbps,
                            "GB/s per GPU and direction within a node"),
                           ("inter_node_gbps", inter_node_gbps,
                            "GB/s per GPU and direction across nodes"),
                           ("price_per_gpu_hour", price_per_gpu_hour, "price per GPU-hour")):
        if v is not None:
            positive(field, v, what=what)
    kind = gpu_kind(gpu)
    peak = find_device(kind.name)
    table = peak.peak_tflops.get(precision) if peak is not None else None
    if peak_tflops is None and table is None:
        raise PlanInputError(f"no peak {precision} FLOP/s known for {kind.name}; give "
                             "`peak_tflops`")
    tflops = peak_tflops if peak_tflops is not None else table
    assert tflops is not None
    src = ("given peak TFLOP/s" if peak_tflops is not None else
           f"{kind.name} {precision}: {peak.source if peak else ''}")
    return Cluster(
        gpus=gpus, gpus_per_node=min(gpus_per_node, gpus) if gpus < gpus_per_node else
        gpus_per_node, gpu_name=kind.name,
        memory_bytes=int(memory_gb * GB) if memory_gb is not None else kind.memory_bytes,
        peak_flops=tflops * 1e12, peak_source=src,
        intra_node_bytes_per_s=(intra_node_gbps * 1e9 if intra_node_gbps is not None
                                else kind.intra_node_bytes_per_s),
        inter_node_bytes_per_s=(inter_node_gbps * 1e9 if inter_node_gbps is not None
                                else kind.inter_node_bytes_per_s),
        power_w=kind.power_w, price_per_gpu_hour=price_per_gpu_hour)
