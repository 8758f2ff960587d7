"""A SIMULATED accelerator for CPU-only demos and benchmarks, always labelled so.

On a real GPU the model's work runs on the device while the host is free to decode the next
batch; on a CPU the model's math competes with the loader workers for the same cores, so a CPU
run cannot show what tuning does for a GPU job. The simulated accelerator restores that shape:
the model's math is a cheap real stand-in computed on the CPU (so the loss, the gradients, the
optimizer and the numerics guard are all real), and the time a device would spend is *slept*,
which releases the GIL, as waiting on a GPU does, so loader workers run meanwhile.

Device time of one micro-batch of ``n`` samples:

    fixed_s + n · sample_s / speedup(precision)

``fixed_s`` is the per-micro-batch cost that a larger batch amortizes (kernel launches, per-step
host work: the host time of forward + backward + other of the naive ``vision`` step on a
data-centre GPU, a few ms per micro-batch; ``benchmarks/gpu_check.py`` measures it), ``sample_s`` the
per-sample compute of a ResNet-50-class model on a mid-range accelerator in fp32, and
``half_speedup`` what bf16/fp16 tensor cores give on it (NVIDIA DeepLearningExamples,
ResNet50 v1.5 for PyTorch: "over 2x faster than training without Tensor Cores"). One third of
the time is spent in forward and two thirds in backward, the 2N/4N FLOP split of a training
step (Kaplan et al. 2020, §2.1). None of it is a measurement of any real device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from redline.workloads.base import Workload
from redline.workloads.vision import VisionConfig, build_vision


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedAccelerator:
    """Pace of the simulated device; every field in seconds or a plain ratio."""

    fixed_s: float = 0.004
    """Device time per micro-batch (forward + backward) whatever its size: launches and
    per-step overhead, amortized by a larger micro-batch."""
    sample_s: float = 0.00125
    """Device time per sample in fp32 (forward + backward)."""
    half_speedup: float = 2.0
    """Per-sample speed-up under bf16/fp16 autocast (tensor cores)."""

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.sample_s < 0:
            raise ValueError(f"fixed_s and sample_s must be >= 0 seconds, got {self.fixed_s}, "
                             f"{self.sample_s}")
        if self.half_speedup < 1:
            raise ValueError(f"half_speedup must be >= 1, got {self.half_speedup}")

    def device_s(self, samples: int, half: bool) -> float:
        """Seconds of simulated device time for one micro-batch of ``samples``."""
        return self.fixed_s + samples * self.sample_s / (self.half_speedup if half else 1.0)

    def label(self) -> str:
        return (f"SIMULATED accelerator: {self.fixed_s * 1e3:g} ms per micro-batch + "
                f"{self.sample_s * 1e3:g} ms per sample in fp32, {self.half_speedup:g}× faster "
                f"per sample in bf16/fp16; the model's math is a linear stand-in on the CPU")


def _half_autocast() -> bool:
    """Whether a CPU autocast region with a 16-bit dtype is active (torch 2.2 … 2.14)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return (torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16))
    return bool(torch.is_autocast_cpu_enabled()  # pragma: no cover - torch < 2.4
                and torch.get_autocast_cpu_dtype() in (torch.bfloat16, torch.float16))


class _Pace(torch.autograd.Function):
    """Identity whose forward and backward each sleep their share of the device time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd_s: float, bwd_s: float,
                sleep: Callable[[float], None]) -> torch.Tensor:
        sleep(fwd_s)
        ctx.bwd_s, ctx.sleep = bwd_s, sleep
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        ctx.sleep(ctx.bwd_s)
        return grad, None, None, None


class SimulatedDeviceModel(nn.Module):
    """``stand_in`` computed for real, paced as the simulated accelerator would run the model.

    Args:
        stand_in: the real (cheap) module whose output and gradients are used.
        sim: the device's pace.
        sleep: how time is spent (``time.sleep`` releases the GIL); injectable for tests.
    """

    def __init__(self, stand_in: nn.Module, sim: SimulatedAccelerator,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.stand_in = stand_in
        self.sim = sim
        self._sleep = sleep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.stand_in(x)
        t = self.sim.device_s(x.shape[0], _half_autocast())
        if not (torch.is_grad_enabled() and out.requires_grad):
            self._sleep(t / 3)  # inference: forward only
            return out
        paced: torch.Tensor = _Pace.apply(out, t / 3, 2 * t / 3, self._sleep)
        return paced


def stand_in_classifier(channels: int = 3, classes: int = 10, pooled: int = 4) -> nn.Module:
    """A linear probe on average-pooled pixels: real math that costs next to nothing."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(pooled), nn.Flatten(),
                         nn.Linear(channels * pooled * pooled, classes))


def build_vision_simulated(sim: SimulatedAccelerator | None = None,
                           cfg: VisionConfig | None = None) -> Workload:
    """The naive ``vision`` workload (same JPEG decode and augmentation on the CPU, same loader,
    same accumulation) whose model runs on the simulated accelerator."""
    sim = sim or SimulatedAccelerator()
    w = build_vision(cfg or VisionConfig(), torch.device("cpu"))
    torch.manual_seed((cfg or VisionConfig()).seed)
    model = SimulatedDeviceModel(stand_in_classifier(), sim)
    lr = w.optimizer.param_groups[0]["lr"]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return Workload(name="vision (simulated accelerator)", model=model, loader=w.loader, optimizer=opt,
                    loss_fn=w.loss_fn,
                    device=w.device, accumulation_steps=w.accumulation_steps, cache_split=w.cache_split)
