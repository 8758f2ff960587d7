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
