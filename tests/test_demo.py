"""The built-in workloads train for real and the demo reports on them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from redline.demo import run_demo
from redline.tune import TuneConfig
from redline.tune.knobs.batch import BATCH_RECORD
from redline.tune.knobs.loader import LOADER_RECORD
from redline.tune.knobs.sdpa import SDPA_RECORD
from redline.workloads import LMConfig, VisionConfig, build_lm, build_vision, train


def test_vision_workload_decodes_and_learns_shapes() -> None:
    w = build_vision(VisionConfig(num_images=4, length=32, batch_size=8, crop=32))
    x, y = next(iter(w.loader))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (8,)
    loss = train(w, 3)
    # cross-entropy over 10 classes from a fresh model: finite, near log(10) ≈ 2.3
    assert math.isfinite(loss) and 0.5 < loss < 10


def test_vision_large_is_resnet50_on_the_same_naive_loop() -> None:
    """GPU-sized vision: torchvision's resnet50(num_classes=10) has 23,528,522 parameters;
    the loop stays naive (no workers, 16 × 4, fp32) so the tuner has the same path to walk."""
    from redline.workloads import WORKLOADS, vision_large_config

    cfg = vision_large_config()
    assert (cfg.model, cfg.crop, cfg.loader.num_workers, cfg.batch_size,
            cfg.accumulation_steps) == ("resnet50", 224, 0, 16, 4)
    # long epochs: the per-epoch refill of the workers' queues must not be what a tuned run
    # measures (≥ 1,000 optimizer steps between refills)
    assert cfg.length // (cfg.batch_size * cfg.accumulation_steps) >= 1000
    # trainable in fp32 and bf16 alike: the tuner's numerics guard must be able to say yes
    from redline.tune.precision import check_numerics

    w = build_vision(VisionConfig(model="resnet50", num_images=8, length=96, batch_size=16,
                                  crop=48, accumulation_steps=1, lr=cfg.lr))
    it = iter(w.loader)
    check = check_numerics(w.model, w.optimizer, [next(it) for _ in range(4)], 16,
                           lambda m, b: w.loss_fn(m, b, w.device), "bf16", torch.device("cpu"))
    assert check.passed, check.reason
    assert max(check.grad_norm_fp32) < 50
    small = VisionConfig(model="resnet50", num_images=2, length=4, batch_size=2, crop=32,
                         accumulation_steps=1)
    w = build_vision(small)
    assert w.name == "vision-large"
    assert sum(p.numel() for p in w.model.parameters()) == 23_528_522
    assert train(w, 1) > 0
    assert "vision-large" in WORKLOADS
    with pytest.raises(ValueError, match="resnet50"):
        VisionConfig(model="vgg")


def test_lm_workload_loss_decreases() -> None:
    w = build_lm(LMConfig(sequences=64, seq_len=32, batch_size=8, lr=3e-3))
    first = train(w, 1)
    last = train(w, 30)
    assert last < first


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="divisible"):
        LMConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match="batch_size"):
        VisionConfig(batch_size=0)


def test_demo_vision_finds_the_data_bottleneck() -> None:
    rep, _ = run_demo("vision", steps=6, show=False, tune_after=False)
    ids = {f.id for f in rep.findings}
    # The fetch decodes on the CPU: CPU work, or, where other processes hold the CPUs while
    # it runs (a shared machine), waiting for a CPU — never storage.
    assert "data_starvation" in ids and {"cpu_preprocessing", "cpu_contention"} & ids
    assert not {"storage_fetch", "fetch_wait"} & ids
    assert rep.measurements.timing.steps_measured == 6
    assert rep.measurements.config.loader is not None
    assert rep.measurements.config.loader.num_workers == 0


def test_demo_vision_storage_waits_on_storage_not_on_the_cpus() -> None:
    """The other kind of starvation: the same JPEGs read from files after SIMULATED storage
    latency; the fetch waits off-CPU while reading, so the finding is storage, not decode."""
    import gc
    import os

    from redline.workloads import WORKLOADS

    w = WORKLOADS["vision-storage"](torch.device("cpu"))
    root = w.loader.dataset.root  # type: ignore[attr-defined]
    assert w.name == "vision-storage" and len(os.listdir(root)) == 128
    del w
    gc.collect()
    assert not os.path.exists(root)  # the files go with the dataset
    rep, _ = run_demo("vision-storage", steps=6, show=False, tune_after=False)
    ids = {f.id for f in rep.findings}
    assert {"data_starvation", "storage_fetch"} <= ids and "cpu_preprocessing" not in ids
    st = next(f for f in rep.findings if f.id == "storage_fetch")
    assert st.evidence["waiting_share_of_wait"] > 0.5


def test_demo_lm_runs() -> None:
    rep, _ = run_demo("lm", steps=4, show=False, tune_after=False)
    assert rep.measurements.timing.steps_measured == 4
    assert rep.measurements.mfu.flops_per_step and rep.measurements.mfu.flops_per_step > 0


@pytest.mark.slow
def test_demo_ends_tuned_with_the_same_effective_batch(tmp_path: Path) -> None:
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, numerics_steps=2,
                     loader_batches_per_trial=4, try_compile=False, reuse=False,
                     store_dir=str(tmp_path))
    rep, res = run_demo("lm", steps=2, show=False, tune_config=cfg)
    assert res is not None
    assert rep.measurements.config.batch_size == 8
    assert res.plan.effective_batch == 8 * 4  # naive: micro 8 × 4 accumulation
    knobs = [d.knob for d in res.plan.decisions]
    assert knobs[:2] == [LOADER_RECORD.label, BATCH_RECORD.label]
    # TinyGPT's hand-written attention, with its location
    sdpa = next(d for d in res.plan.decisions if d.knob == SDPA_RECORD.label)
    assert "lm.py:" in str(sdpa.details["location"]) and not sdpa.kept
    assert res.before.throughput_samples_per_s and res.after.throughput_samples_per_s
    assert res.before_projection.job_time_s is not None


def test_lm_large_is_gpt2_small_shaped_on_the_same_naive_loop() -> None:
    """GPU-sized lm: GPT-2 small's blocks (12 × 768, 12 heads: 85,054,464 parameters outside
    the embeddings and the head), the same naive loop as lm (8 × 4, fp32, hand-written
    attention). Built and stepped here at a reduced width so the test stays fast."""
    from redline.workloads import WORKLOADS, lm_large_config
    from redline.workloads.lm import LMConfig, build_lm

    cfg = lm_large_config()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.seq_len) == (12, 768, 12, 512)
    assert (cfg.batch_size, cfg.accumulation_steps, cfg.loader.num_workers) == (8, 4, 0)
    blocks = sum(p.numel() for b in build_lm(LMConfig(d_model=768, n_heads=12, n_layers=12,
                                                   sequences=8)).model.blocks
                 for p in b.parameters())
    assert blocks == 85_054_464
    small = LMConfig(vocab=64, seq_len=16, d_model=32, n_layers=12, n_heads=4, sequences=32)
    w = build_lm(small, name="lm-large")
    assert w.name == "lm-large" and build_lm(LMConfig(sequences=32)).name == "lm"
    assert sum(p.numel() for b in w.model.blocks for p in b.parameters()) == 12 * (
        12 * 32 * 32 + 13 * 32)
    assert train(w, 1) > 0
    assert "lm-large" in WORKLOADS


def test_demo_default_is_gpu_sized_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """vision on a CPU (and for the simulated accelerator); lm-large on a GPU, where the small
    CNN cannot keep the device busy. The CLI passes the choice through when none is named."""
    from redline.cli import main as cli
    from redline.demo import default_workload

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_workload() == "vision"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_workload() == "lm-large"
    assert default_workload(simulated=True) == "vision"

    seen: list[str] = []
    monkeypatch.setattr("redline.demo.run_demo", lambda w, **kw: seen.append(w))
    assert cli.main(["demo"]) == 0
    assert cli.main(["demo", "--workload", "lm"]) == 0
    assert cli.main(["demo", "--simulated-accelerator"]) == 0
    assert seen == ["lm-large", "lm", "vision"]


def test_demo_passes_the_batch_change_opt_in_to_its_tuning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`redline demo --allow-batch-change` tunes as `redline tune --allow-batch-change` does;
    without it the effective batch is kept. Both skip torch.compile, as the demo always has."""
    from redline.cli import main as cli

    seen: list[Any] = []
    monkeypatch.setattr("redline.demo.run_demo", lambda w, **kw: seen.append(kw["tune_config"]))
    assert cli.main(["demo", "--workload", "vision", "--allow-batch-change"]) == 0
    assert cli.main(["demo", "--workload", "vision"]) == 0
    assert [c.allow_batch_change for c in seen] == [True, False]
    assert not any(c.try_compile or c.reuse for c in seen)
