"""Peak-FLOPs table and MFU arithmetic."""

from __future__ import annotations

import pytest

from redline.measure.mfu import compute_mfu
from redline.measure.peaks import find_device, load_table, peak_flops

REQUIRED = ["Tesla V100-SXM2-16GB", "Tesla T4", "NVIDIA A10G", "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA L40S", "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA GeForce RTX 4090",
            "AMD Instinct MI250X", "AMD Instinct MI300X"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_devices_have_sourced_peaks(name: str) -> None:
    e = find_device(name)
    assert e is not None, name
    assert e.source and "fp32" in e.peak_tflops


def test_specific_entries_win() -> None:
    assert find_device("NVIDIA H100 PCIe").name == "NVIDIA H100 PCIe"  # type: ignore[union-attr]
    assert find_device("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"  # type: ignore[union-attr]
    assert find_device("NVIDIA L40S").name == "NVIDIA L40S"  # type: ignore[union-attr]
    assert find_device("NVIDIA L40") is None  # not L4: tokens, not substrings
    assert find_device("NVIDIA A100-SXM4-80GB").name == "NVIDIA A100 80GB"  # type: ignore[union-attr]


def test_peak_values_and_unknowns() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16")[0] == pytest.approx(989.5e12)  # type: ignore[index]
    assert peak_flops("NVIDIA A100-SXM4-40GB", "tf32")[0] == pytest.approx(156e12)  # type: ignore[index]
    assert peak_flops("Tesla T4", "bf16") is None  # T4 has no bf16
    assert peak_flops("Some Future GPU", "bf16") is None
    assert all(v > 0 for e in load_table() for v in e.peak_tflops.values())


def test_mfu_arithmetic() -> None:
    r = compute_mfu(1e12, 0.01, (989.5e12, "H100"), "bf16")
    assert r.achieved_flops_per_s == pytest.approx(1e14)
    assert r.mfu == pytest.approx(1e14 / 989.5e12)
    assert r.reason is None


def test_mfu_unknown_says_why() -> None:
    assert compute_mfu(1e12, 0.01, None, "bf16").reason == (
        "no peak-FLOPs entry for this device and dtype")
    assert compute_mfu(None, 0.01, (1e12, "x"), "bf16").mfu is None
    assert "0 FLOPs" in (compute_mfu(0.0, 0.01, (1e12, "x"), "bf16").reason or "")


def test_fp32_convolutions_count_against_the_tf32_peak() -> None:
    """cuDNN runs fp32 convolutions in TF32 by default: a conv net "in fp32" held to the fp32
    peak alone reads an MFU far above what its kernels achieve. Its FLOPs are split:
    convolutions at the TF32 peak, the rest at fp32."""
    import torch
    from torch import nn

    from redline.core.measurements import DeviceInfo
    from redline.measure.flops import FlopWindow
    from redline.measure.mfu import fp32_with_tf32_convolutions

    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    win = FlopWindow()
    win.start()
    m(torch.randn(2, 3, 8, 8)).sum().backward()
    win.stop()
    conv_fwd = 2 * 2 * 8 * 6 * 6 * 3 * 3 * 3  # 2·batch·out·H·W·in·k·k
    linear_fwd = 2 * 2 * 288 * 4
    # forward + weight gradient (the input of the first layer needs no gradient)
    assert win.conv_flops == 2 * conv_fwd
    assert win.flops == win.conv_flops + 3 * linear_fwd

    h200 = DeviceInfo(type="cuda", name="NVIDIA H200", count=1, compute_capability="9.0")
    fp32 = peak_flops("NVIDIA H200", "fp32")
    tf32 = peak_flops("NVIDIA H200", "tf32")
    assert fp32 and tf32
    (peak, src), dtype = fp32_with_tf32_convolutions(h200, 100.0, 99.0, fp32, True)
    assert dtype == "tf32-conv+fp32" and "99% of the FLOPs are convolutions" in src
    assert peak == pytest.approx(100 / (99 / tf32[0] + 1 / fp32[0]))
    assert fp32[0] < peak < tf32[0]
    # TF32 convolutions turned off, or a pre-Ampere GPU: the fp32 peak stands
    assert fp32_with_tf32_convolutions(h200, 100.0, 99.0, fp32, False) == (fp32, "fp32")
    v100 = DeviceInfo(type="cuda", name="Tesla V100-SXM2-16GB", count=1, compute_capability="7.0")
    v_fp32 = peak_flops(v100.name, "fp32")
    assert v_fp32
    assert fp32_with_tf32_convolutions(v100, 100.0, 99.0, v_fp32, True) == (v_fp32, "fp32")


def test_mfu_divides_by_the_mean_step_time_as_its_source_says() -> None:
    """MFU = counted FLOPs × steps/s ÷ peak, steps/s over the measured window (1 ÷ the mean
    step time), and the report's source line says so."""
    from redline.core.measurements import DeviceInfo
    from redline.measure.mfu import mfu_for

    h100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3", count=1, compute_capability="9.0")
    bf16 = peak_flops(h100.name, "bf16")
    assert bf16
    r = mfu_for(h100, "bf16-autocast", 1e14, 0.0, 0.5, counted=True)
    assert r.compute_dtype == "bf16" and r.peak_flops_per_s == bf16[0]
    assert r.mfu == pytest.approx(1e14 / 0.5 / bf16[0])
    cpu = mfu_for(DeviceInfo(type="cpu", name="x86_64", count=1), "fp32", 1e9, 0.0, 0.5, counted=True)
    assert cpu.mfu is None and "CPU" in (cpu.reason or "")
    off = mfu_for(h100, "bf16-autocast", None, None, 0.5, counted=False)
    assert off.mfu is None and "turned off" in (off.reason or "")
    unknown = mfu_for(DeviceInfo(type="cuda", name="NVIDIA Imaginary X1", count=1,
                      compute_capability="9.0"), "bf16-autocast",
                      1e14, 0.0, 0.5, counted=True)
    assert unknown.mfu is None and "no peak-FLOPs entry" in (unknown.reason or "")


def test_the_mfu_source_names_the_mean_step_time() -> None:
    import redline

    with redline.watch(warmup_steps=0, count_flops=False) as w:
        pass
    assert "mean step time" in w.report(show=False).measurements.sources["mfu"]
