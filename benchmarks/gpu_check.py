"""One prepared check of every CUDA path redline has; prints one table.

Run on a CUDA machine (a few minutes at most):  python benchmarks/gpu_check.py
Some rows only:  python benchmarks/gpu_check.py --only "GPU decode" trace
Without CUDA it says so and exits with status 2 (nothing here can be simulated).

Rows: CUDA-event step timing vs synchronized wall clock, the no-sync guarantee of the step
timer, NVML sampler readings, allocator memory stats, peak-FLOPs lookup and MFU for this card,
host-sync counting, pinned vs pageable host→device copies, a real CUDA OOM, a whole
`redline.watch` over a GPU training loop (tier, device span, findings), and the step replayed
as CUDA graphs (torch.compile's reduce-overhead mode) under the watch, against eager, with the
graph-blocker spy on the device, and the device-memory curves (a leak named, a flat loop not);
JPEG decode on the device (nvJPEG) checked pixel by pixel against the CPU path and timed
against it; the findings that need a device (a host sync from per-step logging, a small batch
by memory headroom); this device's own profiler trace through redline's trace analysis; the
bf16 numerics guard.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import redline
from redline.measure.cuda import CudaStepTimer, SyncCounter
from redline.measure.nvml import NvmlSampler, import_pynvml
from redline.measure.peaks import find_device, peak_flops
from redline.tune.config import NumericsTolerance

Row = tuple[str, str, str]


def check(name: str, fn: Callable[[], tuple[bool, str]]) -> Row:
    try:
        ok, detail = fn()
        return name, "ok" if ok else "FAIL", detail
    except Exception as e:  # a check that crashes is a failed row, not a crashed script
        return name, "ERROR", f"{type(e).__name__}: {e}"[:160]


def events_vs_wall() -> tuple[bool, str]:
    a = torch.randn(4096, 4096, device="cuda")
    timer = CudaStepTimer()
    torch.cuda.synchronize()
    walls = []
    for i in range(10):
        t = time.perf_counter()
        timer.work_begins()
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        timer.step_ends(i)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    timer.drain()
    dev = [timer.device_s[i] for i in range(10)]
    ratio = sum(dev) / sum(walls)
    return 0.8 < ratio <= 1.02, f"event span / synced wall = {ratio:.3f} (10 steps)"


def timer_adds_no_sync() -> tuple[bool, str]:
    a = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    timer = CudaStepTimer()
    t = time.perf_counter()
    timer.work_begins()
    for _ in range(10):
        a = a @ a
    timer.step_ends(0)
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    gpu = time.perf_counter() - t
    return host < 0.5 * gpu, f"host returned after {host * 1e3:.2f} ms, device took {gpu * 1e3:.1f} ms"


def nvml() -> tuple[bool, str]:
    nv, reason = import_pynvml()
    if nv is None:
        return False, reason or "no NVML"
    s = NvmlSampler(torch.cuda.current_device(), 0.1, nv)
    s.start()
    s.mark()
    a = torch.randn(8192, 8192, device="cuda")
    t = time.time()
    while time.time() - t < 2.0:
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    s.stop()
    r = s.summary()
    ok = r.util_gpu_pct is not None and r.util_gpu_pct > 50 and (r.energy_j or 0) > 0
    return ok, (f"util {r.util_gpu_pct:.0f}% power {r.power_w:.0f} W energy {r.energy_j:.0f} J "
                f"clocks {r.sm_clock_mhz:.0f} MHz reasons {r.clock_event_reasons} "
                f"GPM sm {r.gpm_sm_active_pct} ({r.gpm_reason})")


def memory() -> tuple[bool, str]:
    torch.cuda.reset_peak_memory_stats()
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    peak = torch.cuda.max_memory_allocated()
    del x
    return peak >= 256 * 2**20, f"peak allocated {peak / 2**20:.0f} MiB after a 256 MiB tensor"


def mfu_lookup() -> tuple[bool, str]:
    name = torch.cuda.get_device_name()
    e = find_device(name)
    p = peak_flops(name, "bf16")
    return e is not None and p is not None, f"{name!r} → {e.name if e else None}, bf16 peak {p}"


def sync_count() -> tuple[bool, str]:
    x = torch.randn(1000, device="cuda")
    with SyncCounter() as c:
        for _ in range(3):
            x.sum().item()
    return c.count >= 3, f"{c.count} syncs counted for 3 .item() calls; sites {dict(c.sites)}"


def copies() -> tuple[bool, str]:
    host = torch.randn(64, 3, 224, 224)
    pinned = host.pin_memory()
    out = []
    for name, src in (("pageable", host), ("pinned", pinned)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            src.to("cuda", non_blocking=True)
        host_s = (time.perf_counter() - t) / 10
        torch.cuda.synchronize()
        out.append(f"{name} host {host_s * 1e3:.2f} ms/copy")
    return True, "; ".join(out)


def real_oom() -> tuple[bool, str]:
    free, _ = torch.cuda.mem_get_info()
    try:
        torch.empty(int(free * 2), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        return True, f"torch.OutOfMemoryError: {str(e).splitlines()[0][:90]}"
    return False, "no OOM raised"


def prefetcher() -> tuple[bool, str]:
    from redline.data import DevicePrefetcher

    imgs = [torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8) for _ in range(8)]
    batches = [(x, torch.arange(64)) for x in imgs]
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pf = DevicePrefetcher(batches, "cuda", mean=mean, std=std)
    w = torch.randn(3 * 224 * 224, 10, device="cuda")
    ok = True
    for (x, y), host in zip(pf, imgs, strict=True):
        _ = x.flatten(1) @ w  # compute while the next copy runs
        ref = ((host.cuda().float() / 255 - torch.tensor(mean, device="cuda").view(1, 3, 1, 1))
               / torch.tensor(std, device="cuda").view(1, 3, 1, 1))
        ok &= bool(torch.allclose(x, ref, atol=1e-5)) and y.is_cuda
    torch.cuda.synchronize()
    s = pf.stats
    return ok, (f"{s.batches} batches, {s.bytes_copied / 2**20:.0f} MiB, copy {s.copy_s * 1e3:.1f} ms "
                f"({s.resolved} resolved), ready when requested {s.hidden_fraction}")


def watch_gpu_loop() -> tuple[bool, str]:
    model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    data = [torch.randn(256, 2048) for _ in range(8)]
    with redline.watch(warmup_steps=3) as w:
        for i in range(40):
            x = data[i % 8].to("cuda")
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % 10 == 0:
                loss.item()
    rep = w.report(show=False)
    m = rep.measurements
    return (m.timing.steps_measured == 36 and m.device_metrics.device_span_fraction is not None,
            f"tier {m.tier.tier}; span {m.device_metrics.device_span_fraction:.2f}; "
            f"MFU {m.mfu.mfu}; syncs {m.device_metrics.sync_calls}; "
            f"findings {[f.id for f in rep.findings]}")


def span_excludes_fetches() -> tuple[bool, str]:
    """Accumulation over a slow loader: the device idles through each fetch between
    micro-batches, so device span + data wait must not exceed the step."""
    import time as _time

    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> torch.Tensor:
            _time.sleep(0.0005)  # 8 ms per batch of 16
            return torch.randn(1024)

    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=16)
    with redline.watch(warmup_steps=2) as w:
        it = iter(loader)
        for _ in range(12):
            for _ in range(4):
                model(next(it).cuda()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    m = w.report(show=False).measurements
    span, wait = m.device_metrics.device_span_fraction, m.fraction("data_wait")
    return (span is not None and span + wait <= 1.02,
            f"device span {span:.1%} + data wait {wait:.1%} of the step (≤ 100% expected)")


def batch_finder_cuda() -> tuple[bool, str]:
    """Predicted max batch under a real cap (a memory fraction), verified by the allocator."""
    from redline.tune.batch_finder import find_batch_size
    from redline.tune.samples import state_tensors

    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = 4 * 2**30
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.LayerNorm(4096),
                              nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())

        def step(b: int) -> None:
            model(torch.randn(b, 1024, device="cuda")).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        r = find_batch_size(step, state=lambda: state_tensors(model, opt), max_batch=1 << 20,
                            limit_bytes=cap - torch.cuda.memory_reserved() // 4,
                            cuda_device=torch.device("cuda"))
        step(r.batch)  # must not OOM
        return (r.ooms == 0 and r.trials <= 4,
                f"batch {r.batch} in {r.trials} trials, {r.ooms} OOMs, allocator overhead "
                f"{r.allocator_overhead:.1%}; peak reserved "
                f"{torch.cuda.max_memory_reserved() / 2**30:.2f} of {cap / 2**30:.0f} GiB")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def tuned_loop_cuda() -> tuple[bool, str]:
    """apply_plan on CUDA: prefetcher, bf16 autocast, micro-batches, fused AdamW; device busy."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.core.loader import LoaderSettings
    from redline.tune import TunePlan, apply_plan
    from redline.tune.tuned import plan_key

    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    ds = TensorDataset(torch.randn(4096, 1024))
    loader = DataLoader(ds, batch_size=64)
    key = plan_key(model, torch.device("cuda"), "fp32", next(iter(loader)))
    plan = TunePlan(key=key, effective_batch=256, micro_batch=128, precision="bf16",
                    loader=LoaderSettings(num_workers=2, prefetch_factor=2, pin_memory=True,
                                          persistent_workers=True),
                    prefetch_to_device=True, optimizer_impl="fused")

    def loss_fn(m: nn.Module, b: list[torch.Tensor]) -> torch.Tensor:
        return m(b[0]).float().pow(2).mean()

    tuned = apply_plan(plan, model, opt, loader, loss_fn, device="cuda")
    with redline.watch(warmup_steps=3) as w, tuned:
        for i, batch in enumerate(tuned.loader):
            tuned.step(batch)
            if i == 14:
                break
    m = w.report(show=False).measurements
    busy = m.device_metrics.device_span_fraction
    return (m.timing.steps_measured > 0 and busy is not None,
            f"{m.timing.throughput_samples_per_s:,.0f} samples/s, device busy {busy:.1%}, "
            f"data wait {m.fraction('data_wait'):.1%}")


def kernel_busy_trace() -> tuple[bool, str]:
    """redline tune's exact device busy: a device-only trace of a few steps (kernel union).
    A host-bound step (tiny layers) must read below its CUDA-event span, a GPU-bound one ~1."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.knobs import TunePlan
    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure
    from redline.tune.tuned import plan_key

    out = {}
    for name, width, depth, batch in (("tiny", 64, 12, 32), ("large", 4096, 4, 4096)):
        def factory(width: int = width, depth: int = depth, batch: int = batch) -> TrainSetup:
            torch.manual_seed(0)
            layers: list[nn.Module] = []
            for _ in range(depth):
                layers += [nn.Linear(width, width), nn.GELU()]
            m = nn.Sequential(*layers).cuda()
            ds = TensorDataset(torch.randn(batch * 8, width))
            return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=1e-3),
                              loader=DataLoader(ds, batch_size=batch),
                              loss_fn=lambda mm, b: mm(b[0]).float().pow(2).mean(),
                              device="cuda")

        s = factory()
        key = plan_key(s.model, torch.device("cuda"), "fp32", next(iter(s.loader)))
        plan = TunePlan(key=key, effective_batch=batch, micro_batch=batch)
        # step_only: batches prefetched and cycled. End to end, the large case's 64 MiB
        # batches, collated row by row on the CPU, would be the bottleneck, not the GPU.
        out[name] = measure(factory, plan, name, steps=20, warmup=3, trace=True,
                            step_only=True)
    t, g = out["tiny"], out["large"]
    ok = (t.device_busy_kernels_fraction is not None and t.device_busy_fraction is not None
          and g.device_busy_kernels_fraction is not None
          and t.device_busy_kernels_fraction < t.device_busy_fraction
          and g.device_busy_kernels_fraction > 0.85
          # on the host clock a device-bound step reads a span far above 100 % (many steps
          # fit in the launch queue); on the device's clock a span cannot pass 100 %
          and g.device_busy_fraction is not None and g.device_busy_fraction <= 1.02)
    def pct(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.1%}"

    return ok, (f"tiny: kernels {pct(t.device_busy_kernels_fraction)} vs span "
                f"{pct(t.device_busy_fraction)}; large: kernels "
                f"{pct(g.device_busy_kernels_fraction)} vs span {pct(g.device_busy_fraction)} "
                f"({t.device_busy_kernels_source})")


def conv_mfu() -> tuple[bool, str]:
    """An fp32 conv net's MFU counts its convolutions at the TF32 peak (cuDNN's default), not
    at the fp32 peak, which would read an MFU far above what its kernels achieve."""
    model = nn.Sequential(nn.Conv2d(64, 256, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(256, 64, 3, padding=1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 64, 56, 56, device="cuda")
    with redline.watch(warmup_steps=3) as w:
        for _ in range(24):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    m = w.report(show=False).measurements
    ok = (m.mfu.compute_dtype == "tf32-conv+fp32" and m.mfu.mfu is not None
          and 0 < m.mfu.mfu <= 1 and m.device_metrics.device_span_fraction is not None
          and m.device_metrics.device_span_fraction <= 1.02)
    return ok, (f"dtype {m.mfu.compute_dtype}; MFU {m.mfu.mfu}; peak "
                f"{(m.mfu.peak_flops_per_s or 0) / 1e12:.0f} TFLOP/s; span "
                f"{m.device_metrics.device_span_fraction}")


def cuda_graphs_under_watch() -> tuple[bool, str]:
    """A launch-bound step (many small kernels) eager and replayed as CUDA graphs through the
    tuned loop, each under a watch: the watch must not break the capture nor be captured
    (its steps are still counted and timed), and the graphs should cut the step time."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune import TunePlan, apply_plan
    from redline.tune.tuned import plan_key

    def run(mode: str | None) -> tuple[float, int]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU())
                                for _ in range(24)]).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(64 * 64, 256)), batch_size=64,
                            drop_last=True)
        key = plan_key(model, torch.device("cuda"), "fp32", next(iter(loader)))
        plan = TunePlan(key=key, effective_batch=64, micro_batch=64, compile=mode is not None,
                        compile_mode=mode, prefetch_to_device=True)
        tuned = apply_plan(plan, model, opt, loader,
                           lambda m, b: m(b[0]).float().pow(2).mean(), device="cuda")
        with redline.watch(warmup_steps=8, count_flops=False) as w, tuned:
            for i, batch in enumerate(tuned.loader):
                tuned.step(batch)
                if i == 40:
                    break
        m = w.report(show=False).measurements
        return m.timing.step_time_mean_s or float("nan"), m.timing.steps_measured

    eager_s, n_eager = run(None)
    graph_s, n_graph = run("reduce-overhead")
    return (n_eager > 0 and n_graph > 0 and graph_s < eager_s,
            f"step {eager_s * 1e3:.2f} ms eager → {graph_s * 1e3:.2f} ms as CUDA graphs "
            f"({eager_s / graph_s:.2f}×), {n_graph} steps measured under the watch")


def graph_spy_on_cuda() -> tuple[bool, str]:
    """The refusal's spy sees a host read inside a CUDA step (the .item() of a logged loss)."""
    from redline.tune.cuda_graphs import graph_blockers

    class Logs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            self.peak = y.max().item()
            return y

    found = graph_blockers(Logs().cuda(), torch.randn(8, 64, device="cuda"),
                           lambda m, b: m(b).pow(2).mean())
    return len(found) == 1 and ".item()" in found[0].what, "; ".join(
        f"{b.location}: {b.what}" for b in found)[:150]


def memory_over_time() -> tuple[bool, str]:
    """The device-memory curves on a real device: a loop that keeps a 4 MiB CUDA tensor every
    step gets memory_growth on the device's memory, read on the sampler's thread
    (torch.cuda.memory_allocated / memory_reserved); the same loop keeping nothing does not."""
    def run(leak: bool) -> redline.Report:
        model = nn.Linear(256, 256).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        kept: list[torch.Tensor] = []
        x = torch.randn(64, 256, device="cuda")
        with redline.watch(warmup_steps=3, count_flops=False, sample_interval_s=0.05) as w:
            for _ in range(300):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                if leak:
                    kept.append(torch.ones(2**20, device="cuda"))  # 4 MiB
                time.sleep(0.005)
        assert w.memory.cuda_error is None, w.memory.cuda_error
        return w.report(show=False)

    leak, flat = run(True), run(False)
    found = [f for f in leak.findings if f.id == "memory_growth"]
    mt = leak.measurements.memory
    dev = [c for c in (mt.curves if mt else []) if c.kind == "cuda_allocated"]
    ok = (bool(found) and str(found[0].evidence["kind"]).startswith("cuda_") and bool(dev)
          and "memory_growth" not in [f.id for f in flat.findings])
    slope = dev[0].slope_bytes_per_1k_steps if dev else None
    return ok, (f"leak: {found[0].title if found else 'no finding'}; allocated slope "
                f"{'unknown' if slope is None else f'{slope / 2**20:.0f} MiB'}/1k steps "
                "(4,000 expected); flat: "
                f"{'memory_growth' if 'memory_growth' in [f.id for f in flat.findings] else 'none'}")


def _vision_split(length: int = 512) -> Any:
    from redline.workloads.vision import SyntheticJpegDataset, vision_large_config

    return SyntheticJpegDataset(dataclasses.replace(vision_large_config(), length=length))


def gpu_decode_pixels() -> tuple[bool, str]:
    """nvJPEG decode + crop/flip/normalize on the device against Pillow's decode and resize on
    the CPU, same boxes and flips, over vision-large's JPEGs (320 × 240, 224-pixel crops)."""
    from redline.data.device_decode import DeviceDecoder, compare_paths

    split = _vision_split().jpeg_split()
    decoder = DeviceDecoder(split, "cuda")
    agreement = compare_paths(split, "cuda", samples=64, decoder=decoder)
    return (agreement.close and decoder.stats.images_on_device == agreement.images
            and decoder.stats.images_on_cpu == 0,
            f"{agreement.images} images, device − CPU: mean {agreement.mean_abs_levels:.2f} "
            f"levels, p99 {agreement.p99_abs_levels:.2f}, max {agreement.max_abs_levels:.1f} "
            f"(on device {decoder.stats.images_on_device}, on CPU "
            f"{decoder.stats.images_on_cpu} {decoder.stats.fallback_reason or ''})")


def gpu_decode_speed() -> tuple[bool, str]:
    """Batches of 64 decoded and augmented on the device (host time until the call returns,
    device time synchronized) against the CPU path on one core (Pillow, per sample)."""
    import random

    from redline.data.device_decode import DeviceDecoder, EncodedJpegs, collate_encoded

    ds = _vision_split()
    split = ds.jpeg_split()
    encoded = EncodedJpegs(split, len(ds))
    batches = [collate_encoded([encoded[64 * b + i] for i in range(64)]) for b in range(8)]
    decoder = DeviceDecoder(split, "cuda")
    random.seed(0)
    for batch in batches[:2]:
        decoder(batch)
    torch.cuda.synchronize()
    host_s, t0 = 0.0, time.perf_counter()
    for _ in range(3):
        for batch in batches:
            t = time.perf_counter()
            decoder(batch)
            host_s += time.perf_counter() - t
    torch.cuda.synchronize()
    n = 3 * len(batches) * 64
    device_rate = n / (time.perf_counter() - t0)
    t = time.perf_counter()
    for i in range(128):
        ds[i]
    cpu_rate = 128 / (time.perf_counter() - t)
    return (device_rate > cpu_rate and decoder.stats.images_on_cpu == 0,
            f"device {device_rate:,.0f} images/s ({host_s / (n / 64) * 1e3:.2f} ms of host "
            f"time per batch of 64) vs CPU path {cpu_rate:,.0f} images/s per core: "
            f"{device_rate / cpu_rate:.1f} cores' worth")


def logging_sync_finding() -> tuple[bool, str]:
    """A loop that logs its loss with .item() every step: the host waits for the device each
    step; the report must name the sync."""
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    history = []
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for _ in range(40):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss.item())
    rep = w.report(show=False)
    ids = [f.id for f in rep.findings]
    return (bool({"host_sync", "logging_in_loop"} & set(ids)),
            f"syncs {rep.measurements.device_metrics.sync_calls}; findings {ids}")


def small_batch_headroom() -> tuple[bool, str]:
    """A batch of 8 through a small MLP, twice: with 2 ms of the loop's own host work per step
    the device idles most of the step with nearly all its memory free, and small_batch must be
    named; fed instead by a loader whose samples take that time, the idle is the data wait's,
    and small_batch must not claim it (data_starvation does)."""
    from torch.utils.data import DataLoader, Dataset

    class Prepared(Dataset[tuple[torch.Tensor, int]]):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            time.sleep(0.00025)  # host preprocessing: 2 ms a batch of 8
            return torch.randn(256), i % 10

    def run(starved: bool) -> list[str]:
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        ready = [(torch.randn(8, 256), torch.randint(0, 10, (8,))) for _ in range(8)]
        batches = iter(DataLoader(Prepared(), batch_size=8)) if starved else None
        with redline.watch(warmup_steps=3, count_flops=False) as w:
            for i in range(60):
                x, y = next(batches) if batches is not None else ready[i % 8]
                loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)),
                                                   y.cuda(non_blocking=True))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if batches is None:
                    time.sleep(0.002)  # the loop's own per-step host work
        return [f.id for f in w.report(show=False).findings]

    host, starved = run(False), run(True)
    return ("small_batch" in host and "small_batch" not in starved
            and "data_starvation" in starved,
            f"host work per step: {host}; data-starved: {starved}")


def device_trace() -> tuple[bool, str]:
    """This device's own profiler trace read by redline's trace analysis: its device time
    against the raw sum of the trace's kernel, memcpy and memset durations (one stream, so
    the union is the sum)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from redline.trace import analyze_paths

    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.GELU())
                            for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(1024, 2048, device="cuda")
    for _ in range(3):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/trace.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
        prof.export_chrome_trace(path)
        analysis = analyze_paths([path])
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    theirs_us = sum(float(e.get("dur", 0)) for e in events
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    rank = analysis.ranks[0]
    ours_us = sum(rank.kernel_types_us.values())
    temporal = rank.temporal
    busy = temporal.pct(temporal.compute_us + temporal.non_compute_us) if temporal else None
    ratio = ours_us / theirs_us if theirs_us else float("nan")
    return (rank.device_events > 0 and 0.9 < ratio < 1.1,
            f"{rank.device_events} device events; device time {ours_us / 1e3:.1f} ms vs the "
            f"trace's raw sum {theirs_us / 1e3:.1f} ms ({ratio:.3f}); busy "
            f"{'unknown' if busy is None else f'{busy:.1f} %'}; device {rank.device_name}")


def bf16_numerics() -> tuple[bool, str]:
    """The precision knob's guard on the device: bf16 autocast against fp32 over 6 steps of a
    small transformer, and the step's speed in each."""
    from redline.tune.precision import check_numerics

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 4), nn.Linear(512, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [(torch.randn(32, 128, 512, device="cuda"), torch.randn(32, 128, 512, device="cuda"))
               for _ in range(6)]

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]).float(), b[1])

    chk = check_numerics(model, opt, batches, 32, loss_fn, "bf16", torch.device("cuda"),
                         NumericsTolerance())
    return chk.passed, chk.reason[:150]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); run this on a "
              "GPU machine.")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"CC {'.'.join(map(str, torch.cuda.get_device_capability()))}")
    # --only WORD ...: the rows whose name holds one of the words (a rerun of some rows)
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else []
    rows = [check(n, f) for n, f in [
        ("events vs wall clock", events_vs_wall), ("step timer adds no sync", timer_adds_no_sync),
        ("NVML sampler", nvml), ("allocator memory stats", memory),
        ("peak FLOPs lookup", mfu_lookup), ("host-sync counter", sync_count),
        ("pinned vs pageable H2D", copies), ("DevicePrefetcher", prefetcher),
        ("real CUDA OOM", real_oom),
        ("watch over a GPU loop", watch_gpu_loop),
        ("span excludes fetches", span_excludes_fetches),
        ("batch finder on CUDA", batch_finder_cuda), ("tuned loop on CUDA", tuned_loop_cuda),
        ("kernel busy from a trace", kernel_busy_trace), ("MFU of an fp32 conv net", conv_mfu),
        ("CUDA graphs under the watch", cuda_graphs_under_watch),
        ("graph-blocker spy on CUDA", graph_spy_on_cuda),
        ("device memory over time", memory_over_time),
        ("GPU decode: pixels vs CPU path", gpu_decode_pixels),
        ("GPU decode: speed", gpu_decode_speed),
        ("host sync from logging", logging_sync_finding),
        ("small batch by memory headroom", small_batch_headroom),
        ("trace of this device", device_trace),
        ("bf16 numerics guard", bf16_numerics)]
        if not only or any(word in n for word in only)]
    w = max(len(r[0]) for r in rows)
    print(f"| {'check':<{w}} | result | detail |")
    print(f"|{'-' * (w + 2)}|--------|--------|")
    for name, res, detail in rows:
        print(f"| {name:<{w}} | {res:<6} | {detail} |")
    return 0 if all(r[1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
