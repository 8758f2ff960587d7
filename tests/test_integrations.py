"""The framework integrations' parts that need no training run: a plan in Lightning's and
Hugging Face's words (checked by the frameworks' own argument classes), the metrics a running
watch gives the loggers, and the time a callback leaves out of the steps (evaluations)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import redline
from factories import plan_key
from redline.core.loader import LoaderSettings
from redline.integrations import IntegrationError, hf_settings, lightning_settings
from redline.integrations.session import FitWatch
from redline.measure.config import WatchConfig
from redline.measure.live import live_snapshot
from redline.measure.step_record import DATA_WAIT
from redline.tune.ddp import DdpSettings
from redline.tune.knobs import TunePlan


def _plan(**kw: Any) -> TunePlan:
    return TunePlan(key=plan_key(), **{"effective_batch": 64, "micro_batch": 32, **kw})


def test_the_batch_precision_and_loader_in_lightning_words() -> None:
    s = lightning_settings(_plan(precision="bf16", loader=LoaderSettings(
        num_workers=4, prefetch_factor=4, pin_memory=True, persistent_workers=True)))
    assert s.arguments == {"accumulate_grad_batches": 2, "precision": "bf16-mixed"}
    assert s.dataloader == {"batch_size": 32, "num_workers": 4, "pin_memory": True,
                            "prefetch_factor": 4, "persistent_workers": True}
    assert s.effective_batch == 64 and s.code == []
    assert "L.Trainer(accumulate_grad_batches=2, precision='bf16-mixed', ...)" in s.snippet()


def test_a_micro_batch_that_does_not_divide_the_effective_batch_exports_exactly() -> None:
    # The plain loop splits 64 into 48 + 16; the frameworks take one size: 32 × 2.
    lit, hf = lightning_settings(_plan(micro_batch=48)), hf_settings(_plan(micro_batch=48))
    assert (lit.dataloader["batch_size"], lit.arguments["accumulate_grad_batches"]) == (32, 2)
    assert (hf.arguments["per_device_train_batch_size"],
            hf.arguments["gradient_accumulation_steps"]) == (32, 2)
    for s in (lit, hf):
        assert any("largest that divides the effective batch 64" in c for c in s.code)


def test_what_lightning_has_no_argument_for_becomes_code() -> None:
    s = lightning_settings(_plan(precision="tf32", compile=True, channels_last=True,
                                 optimizer_impl="fused", cudnn_benchmark=True,
                                 ddp=DdpSettings(bucket_cap_mb=50.0)))
    assert s.arguments["precision"] == "32-true" and s.arguments["benchmark"] is True
    assert s.arguments["strategy"] == "DDPStrategy(bucket_cap_mb=50.0)"
    code = "\n".join(s.code)
    for line in ('torch.set_float32_matmul_precision("high")', "torch.compile(model)",
                 "channels_last", "fused=True", "import DDPStrategy"):
        assert line in code


def test_cuda_graphs_and_gpu_decode_are_said_in_both_frameworks() -> None:
    plan = _plan(compile=True, compile_mode="reduce-overhead", gpu_decode=True)
    lit, hf = lightning_settings(plan), hf_settings(plan)
    assert "model = torch.compile(model, mode='reduce-overhead')  # before fit" in lit.code
    assert not any(line == "model = torch.compile(model)  # before fit" for line in lit.code)
    assert hf.arguments["torch_compile"] is True
    assert hf.arguments["torch_compile_mode"] == "reduce-overhead"
    for s in (lit, hf):
        assert any("EncodedJpegs(jpeg_split, len(dataset))" in line for line in s.code)
    assert "torch_compile_mode" not in hf_settings(_plan(compile=True)).arguments


def test_a_changed_batch_and_the_decode_cache_are_said_in_both_frameworks() -> None:
    plan = _plan(effective_batch=256, micro_batch=128, user_effective_batch=64, lr_scale=4.0,
                 lr_rule="linear", lr_warmup_steps=25, decode_cache=True)
    lit, hf = lightning_settings(plan), hf_settings(plan)
    assert hf.arguments["warmup_steps"] == 25
    for s in (lit, hf):
        code = "\n".join(s.code)
        assert "the effective batch changed 64 → 256" in code and "learning rate × 4" in code
        assert "warm-up from your rate over 25 steps" in code
        assert "CachedDataset(source, deterministic, random)" in code
    assert "warmup_steps" not in hf_settings(_plan()).arguments


def test_hf_training_arguments_accept_the_export() -> None:
    transformers = pytest.importorskip("transformers")
    plan = _plan(micro_batch=16, precision="bf16", optimizer_impl="fused", compile=True,
                 compile_mode="reduce-overhead",
                 ddp=DdpSettings(bucket_cap_mb=40.0), loader=LoaderSettings(
                     num_workers=2, prefetch_factor=3, pin_memory=True, persistent_workers=True))
    s = hf_settings(plan)
    # TrainingArguments writes its compile and precision settings into os.environ
    # (ACCELERATE_DYNAMO_BACKEND, ACCELERATE_MIXED_PRECISION, …): kept in, they would reach
    # every later test's subprocesses and compile their Accelerate and HF runs
    with mock.patch.dict(os.environ):
        args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, report_to=[],
                                              **s.arguments)
    got = {k: getattr(args, k) for k in s.arguments}
    assert got.pop("optim") == "adamw_torch_fused"  # an enum of TrainingArguments
    assert s.arguments["dataloader_pin_memory"] is True
    got.pop("dataloader_pin_memory")  # use_cpu=True turns it off: nothing to pin for
    assert got == {k: v for k, v in s.arguments.items()
                   if k not in ("optim", "dataloader_pin_memory")}
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64
    assert (args.bf16, args.dataloader_prefetch_factor, args.ddp_bucket_cap_mb) == (True, 3, 40)


def test_lightning_trainer_accepts_the_export() -> None:
    pl = pytest.importorskip("lightning.pytorch")
    s = lightning_settings(_plan(micro_batch=16, precision="bf16"))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **s.arguments)
    assert trainer.accumulate_grad_batches == 4 and trainer.precision == "bf16-mixed"


# -- live metrics and skipped time ------------------------------------------------------

def _loop(steps: int) -> None:
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in DataLoader(TensorDataset(torch.randn(steps * 4, 8)), batch_size=4):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()


def test_live_snapshot_is_the_window_of_the_last_measured_steps() -> None:
    with redline.Watch(WatchConfig(warmup_steps=2, count_flops=False)) as w:
        _loop(8)
        snap = live_snapshot(w, window_steps=3)
        whole = live_snapshot(w, window_steps=100)
    assert snap is not None and whole is not None
    measured = [s for s in w.steps if s.kind == "measured"]
    recent = measured[-3:]
    wall = sum(s.step_s for s in recent)
    assert (snap.steps_measured, snap.window_steps, whole.window_steps) == (
        len(measured), 3, len(measured))
    assert snap.step_time_mean_s == pytest.approx(wall / 3)
    assert snap.data_wait_fraction == pytest.approx(
        sum(s.phases[DATA_WAIT] for s in recent) / wall)
    assert snap.samples_per_s == pytest.approx(sum(s.samples or 0 for s in recent) / wall)
    assert snap.device_busy_fraction is None and snap.mfu is None  # CPU: unknown, not guessed
    metrics = snap.as_metrics()
    assert metrics["redline/step_time_ms"] == pytest.approx(snap.step_time_mean_s * 1e3)
    assert "redline/device_busy_share" not in metrics and "redline/mfu" not in metrics


def test_live_snapshot_finds_its_window_behind_steps_that_are_not_measured() -> None:
    # Steps excluded at the end (a FLOP count, a trace) push the measured ones further back
    # than the first tail read: the window is still the last measured steps. The count of
    # measured steps is the watch's own (37 closed as measured; the relabelling here comes
    # after), read without a pass over every step.
    with redline.Watch(WatchConfig(warmup_steps=3, count_flops=False)) as w:
        _loop(40)
        for s in w.steps[-30:]:
            s.kind = "excluded"
        measured = [s for s in w.steps if s.kind == "measured"]
        snap = live_snapshot(w, window_steps=5)
    assert snap is not None and snap.window_steps == 5
    assert snap.step_time_mean_s == pytest.approx(sum(s.step_s for s in measured[-5:]) / 5)
    assert snap.steps_measured == w.measured_count == 37
    assert snap.steps_total == 40


def test_a_long_run_keeps_a_bounded_sample_with_exact_counts_and_says_so() -> None:
    # A job that runs for days: past steps_kept records the watch keeps a uniform sample
    # (memory bounded), the counts stay exact, live metrics still read every recent step, and
    # the report says its statistics are over a sample.
    with redline.Watch(WatchConfig(warmup_steps=2, count_flops=False, steps_kept=1000)) as w:
        _loop(2600)
        snap = live_snapshot(w, window_steps=5)
        last = list(w.tracker.recent)[-5:]
    assert w.tracker.stride == 4 and 500 <= len(w.steps) < 1000
    assert all(s.index % 4 == 0 for s in w.steps)
    assert snap is not None and snap.steps_total == 2600 and snap.steps_measured == 2598
    assert snap.step_time_mean_s == pytest.approx(sum(s.step_s for s in last) / 5)
    m = w.report(show=False).measurements
    assert (m.timing.steps_total, m.timing.steps_warmup, m.timing.steps_measured) == (
        2600, 2, 2598)
    assert any("every 4th step, a uniform sample" in n for n in m.notes)
    with pytest.raises(ValueError, match="steps_kept must be >= 1000"):
        WatchConfig(steps_kept=10)


def test_a_long_run_on_cuda_drops_the_device_times_of_the_steps_it_no_longer_keeps() -> None:
    from redline.measure.cuda import CudaStepTimer

    timer = CudaStepTimer()
    timer.device_s = {i: 0.001 for i in range(2600)}  # as if every step's events were resolved
    with redline.Watch(WatchConfig(warmup_steps=2, count_flops=False, steps_kept=1000)) as w:
        w.cuda_timer = timer
        _loop(2600)
        w.cuda_timer = None  # a CPU run: no device memory to read at exit
    # stride 2 from step 999 (nothing older than the last 1,024 steps yet), 4 from step 1998:
    # the steps before 1998 - 1024 that are not multiples of 4 are forgotten
    assert w.tracker.stride == 4
    assert all(i % 4 == 0 or i > 974 for i in timer.device_s)
    assert set(range(0, 975, 4)) | set(range(975, 2600)) == set(timer.device_s)


def test_live_snapshot_reads_device_time_only_of_completed_steps() -> None:
    class Timer:
        device_s: dict[int, float] = {}  # noqa: RUF012

    with redline.Watch(WatchConfig(warmup_steps=1, count_flops=False)) as w:
        _loop(4)
        last = w.steps[-1]
        w.cuda_timer = Timer()  # type: ignore[assignment]
        Timer.device_s = {last.index: last.step_s / 2}  # one step's events done, others not
        snap = live_snapshot(w, window_steps=3)
        w.cuda_timer = None
    assert snap is not None and snap.device_busy_fraction == pytest.approx(0.5)


def test_skip_leaves_an_evaluation_out_of_the_next_step() -> None:
    fit = FitWatch(config=WatchConfig(warmup_steps=0, count_flops=False), show=False)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fit.begin()
    for i in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        fit.step()
        if i == 1:  # an evaluation between steps 1 and 2: forwards and 0.3 s
            with torch.no_grad():
                model(torch.randn(4, 8))
            time.sleep(0.3)
            fit.skip()
    rep = fit.end()
    assert rep is not None and fit.watch is not None
    steps = fit.watch.steps
    # the 0.3 s are in no step (the first step also holds autograd's first-call set-up,
    # which a loaded host can stretch to a fifth of a second: left out of the bound)
    assert len(steps) == 4 and max(s.step_s for s in steps[1:]) < 0.2, steps
    assert sum(s.step_s for s in steps) < steps[-1].end_s - steps[0].start_s - 0.29
    assert rep.measurements.timing.step_source == "manual"
    assert rep.measurements.counts["forward"] == 5  # seen, but in no step's time


def test_a_report_path_in_a_missing_folder_fails_when_the_callback_is_built(
        tmp_path: Path) -> None:
    with pytest.raises(IntegrationError, match="does not exist"):
        FitWatch(config=WatchConfig(), json_path=str(tmp_path / "no" / "r.json"))
    with pytest.raises(IntegrationError, match=r"html_path .*does not exist"):
        FitWatch(config=WatchConfig(), html_path=str(tmp_path / "no" / "r.html"))
    with pytest.raises(IntegrationError, match="name the same file"):
        FitWatch(config=WatchConfig(), json_path=str(tmp_path / "r"), html_path=str(tmp_path / "r"))
