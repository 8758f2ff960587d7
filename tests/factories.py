"""Synthetic measurements for rule tests (each test changes only what its rule reads), and
small datasets for the cache's tests."""

from __future__ import annotations

import types
from dataclasses import replace
from typing import Any

from redline.core.loader import LoaderSettings
from redline.core.measurements import (
    DdpStats,
    DeviceInfo,
    DeviceMetrics,
    EffectiveConfig,
    FsdpStats,
    H2DMetrics,
    HostMetrics,
    LoaderReport,
    Measurements,
    MetricTier,
    MfuResult,
    PhaseShare,
    PrecisionInfo,
    StepTiming,
)
from redline.tune.tuned import PlanKey


def breakdown(**fractions: float) -> list[PhaseShare]:
    step = 0.1
    fr = {"data_wait": 0.0, "h2d_copy": 0.0, "forward": 0.3, "backward": 0.5, "optimizer": 0.1}
    fr.update(fractions)
    fr["other"] = max(0.0, 1.0 - sum(fr.values()))
    return [PhaseShare(phase=k, mean_s=v * step, fraction=v) for k, v in fr.items()]


def loader(**kw: Any) -> LoaderReport:
    """A loader report; ``num_workers``, ``prefetch_factor``, ``pin_memory`` and
    ``persistent_workers`` go into its settings."""
    settings = LoaderSettings(**{k: kw.pop(k) for k in list(kw)
                                 if k in LoaderSettings.__dataclass_fields__})
    base = LoaderReport(batch_size=32, settings=settings, dataset_type="DS",
                        multiprocessing_context=None, iterators=1, worker_starts=0,
                        worker_startup_mean_s=None, worker_startup_total_s=0.0,
                        batch_bytes=32 * 3 * 224 * 224 * 4)
    return replace(base, **kw)


def measurements(*, device: str = "cpu", phases: dict[str, float] | None = None,
                 host: dict[str, Any] | None = None, dev: dict[str, Any] | None = None,
                 loaders: list[LoaderReport] | None = None, precision: str = "fp32",
                 cc: str | None = None, name: str = "x86_64", steps: int = 20,
                 ddp: DdpStats | None = None, fsdp: FsdpStats | None = None,
                 **config: Any) -> Measurements:
    loaders = loaders if loaders is not None else [loader()]
    li = loaders[0] if loaders else None
    h = HostMetrics(cpus_available=2.0, cpus_source="test", torch_threads=2,
                    main_cpu_cores=1.0, workers_cpu_cores=0.0, workers_seen=0,
                    main_rss_peak_bytes=1, workers_rss_peak_bytes=0, read_bytes_per_s=0.0,
                    read_chars_per_s=0.0, data_fetch_cpu_fraction=None,
                    shm_total_bytes=64 * 2**20, shm_free_bytes=64 * 2**20)
    h = replace(h, **(host or {}))
    dm = DeviceMetrics(device_span_fraction=None, device_s_per_step=None, peak_allocated_bytes=None,
                       peak_reserved_bytes=None, total_memory_bytes=None, nvml=None, sync_calls=None,
                       sync_calls_per_step=None)
    if device == "cuda":
        dm = DeviceMetrics(device_span_fraction=0.9, device_s_per_step=0.09, peak_allocated_bytes=2**30,
                           peak_reserved_bytes=2**31, total_memory_bytes=80 * 2**30, nvml=None,
                           sync_calls=0, sync_calls_per_step=0.0)
    dm = replace(dm, **(dev or {}))
    cfg = EffectiveConfig(device=device, batch_size=li.batch_size if li else 32,
                          loader=li.settings if li else None,
                          precision=precision, torch_threads=h.torch_threads,
                          data_source="DataLoader")
    cfg = replace(cfg, **config)
    return Measurements(
        device=DeviceInfo(type=device, name=name, count=1, compute_capability=cc,
                          total_memory_bytes=80 * 2**30 if device == "cuda" else None),
        config=cfg,
        timing=StepTiming(step_source="optimizer", steps_total=steps + 4, steps_warmup=3, steps_excluded=1,
                          steps_measured=steps, step_time_p50_s=0.1, step_time_p95_s=0.12,
                          step_time_mean_s=0.1, samples_per_step=32.0, throughput_samples_per_s=320.0,
                          steps_per_s=10.0),
        breakdown=breakdown(**(phases or {})),
        host=h, device_metrics=dm, loaders=loaders,
        precision=PrecisionInfo(effective=precision, param_dtype="fp32", autocast_dtype=None,
                                autocast_forward_fraction=0.0, float32_matmul_precision="highest",
                                tf32_matmul_allowed=False),
        mfu=MfuResult(flops_per_step=None, achieved_flops_per_s=None, peak_flops_per_s=None,
                      compute_dtype=None, mfu=None, peak_source=None, reason="test"),
        tier=MetricTier(tier="cpu", have=[], missing=[]), counts={}, root_modules=["Net"], sources={},
                        ddp=ddp,
        fsdp=fsdp,
    )


__all__ = ["H2DMetrics", "breakdown", "loader", "measurements", "plan_key"]


def plan_key(sig: str = "abc") -> PlanKey:
    """A plan key for a CPU model whose samples are 8 floats."""
    return PlanKey(model_signature=sig, model_class="m.Net", device="cpu:x86_64", precision="fp32",
                   input_shapes="(8,):float32")


class FakeNvml(types.SimpleNamespace):
    """An NVML driver stand-in: fixed readings, 5 J more energy at each reading."""

    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        super().__init__()
        self.energy_mj = 1_000_000
        self.inited = False

    def nvmlInit(self) -> None:
        self.inited = True

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        self.energy_mj += 5_000  # 5 J per reading
        return self.energy_mj

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return types.SimpleNamespace(gpu=80, memory=30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 250_000  # mW

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        return 1980

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return types.SimpleNamespace(used=10 * 2**30)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x4 | 0x1


class Numbers:
    """A map-style dataset of ``n`` items: item ``i`` is ``i`` (what a cache's deterministic
    transform turns into a sample)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i
