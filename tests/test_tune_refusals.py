"""`redline tune` refuses what it cannot judge: a loss that is not a scalar, a remembered plan
for a job that fails its numerics, a loader of another batch size, a malformed plan file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.core.loader import LoaderSettings
from redline.measure.agree import NoJobStoreError
from redline.tune import (
    NonFiniteLossError,
    SetupError,
    TrainSetup,
    TuneConfig,
    TunePlan,
    TunePlanError,
    TunePlanMismatchError,
    apply_plan,
    load_plan,
    save_plan,
    tune,
)
from redline.tune.decision import Decision
from redline.tune.plan_store import PlanStore
from redline.tune.tuned import plan_key


def _setup(loss: Any = None, scale: float = 1.0, offset: float = 0.0,
           batch: int = 8) -> TrainSetup:
    torch.manual_seed(0)
    m = nn.Linear(8, 2)
    with torch.no_grad():
        m.bias += offset
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=g) * scale, torch.randn(64, 2, generator=g))
    return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=1e-4),
                      loader=DataLoader(data, batch_size=batch),
                      loss_fn=loss or (lambda mm, b: nn.functional.mse_loss(mm(b[0]) - offset,
                                                                           b[1])))


def _cfg(tmp_path: Path, **kw: Any) -> TuneConfig:
    base: dict[str, Any] = dict(steps_per_trial=2, rounds=1, warmup_steps=1, numerics_steps=3,
                                tune_loader=False, tune_batch=False, tune_kernels=False,
                                store_dir=str(tmp_path / "plans"))
    base.update(kw)
    return TuneConfig(**base)


def test_a_loss_that_is_not_a_scalar_is_refused_by_name(tmp_path: Path) -> None:
    def per_sample(model: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(model(b[0]), b[1], reduction="none").mean(1)

    with pytest.raises(SetupError, match=r"loss_fn \(.*per_sample\) returned a tensor of shape "
                                         r"\(8,\); expected a scalar tensor"):
        tune(lambda: _setup(per_sample), _cfg(tmp_path))
    with pytest.raises(SetupError, match="returned a float"):
        tune(lambda: _setup(lambda m, b: 1.0), _cfg(tmp_path))  # type: ignore[arg-type,return-value]


def test_a_rank_without_its_job_store_is_refused_before_the_factory_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    built: list[TrainSetup] = []
    with pytest.raises(NoJobStoreError, match=r"rank 1 of 2 .*MASTER_ADDR / MASTER_PORT are not "
                                             r"set.*torchrun --nproc_per_node=N --no-python "
                                             r"redline tune"):
        tune(lambda: built.append(_setup()) or built[-1], _cfg(tmp_path))
    assert built == []  # refused before the user's factory ran
    assert not (tmp_path / "plans").exists()


def test_a_remembered_plan_is_reused_only_after_the_numerics_check(tmp_path: Path) -> None:
    ok = _setup()
    first = next(iter(DataLoader(ok.loader.dataset, batch_size=1)))
    key = plan_key(ok.model, torch.device("cpu"), "fp32", first)
    store = PlanStore(tmp_path / "plans")
    store.put(TunePlan(key=key, effective_batch=8, micro_batch=8, precision="bf16",
                       source_batch_size=8))
    said: list[str] = []
    res = tune(lambda: _setup(), _cfg(tmp_path, tune_precision=False), log=said.append)
    assert res.reused_plan is not None and res.plan.precision == "bf16"
    # the same model and inputs, but outputs near 1000 carrying a small signal: bf16's 8-bit
    # mantissa rounds it away, so the remembered bf16 plan is not reused for this job
    said.clear()
    res = tune(lambda: _setup(offset=1000.0), _cfg(tmp_path, tune_precision=False),
               log=said.append)
    assert res.reused_plan is None and res.plan.precision == "fp32"
    assert any(s.startswith("not reusing the remembered plan") and "bf16 refused" in s
               for s in said)
    with pytest.raises(NonFiniteLossError, match="not a precision problem"):
        tune(lambda: _setup(scale=float("nan")), _cfg(tmp_path))


def test_apply_plan_refuses_a_loader_of_another_batch_size(tmp_path: Path) -> None:
    s = _setup()
    first = next(iter(DataLoader(s.loader.dataset, batch_size=1)))
    plan = TunePlan(key=plan_key(s.model, torch.device("cpu"), "fp32", first),
                    effective_batch=32, micro_batch=16, source_batch_size=8)
    other = _setup(batch=16)
    with pytest.raises(TunePlanMismatchError, match=r"batch_size=16; the plan was made for "
                                                r"batch_size=8, an effective batch of 32"):
        apply_plan(plan, other.model, other.optimizer, other.loader, other.loss_fn)
    tuned = apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn)
    assert next(iter(tuned.loader))[0].shape[0] == 32


def _plan_dict() -> dict[str, Any]:
    s = _setup()
    first = next(iter(DataLoader(s.loader.dataset, batch_size=1)))
    plan = TunePlan(key=plan_key(s.model, torch.device("cpu"), "fp32", first),
                    effective_batch=32, micro_batch=16, source_batch_size=8,
                    loader=LoaderSettings(num_workers=2, prefetch_factor=2),
                    decisions=[Decision(knob="batch size", kept=True, reason="1.4×", value="16")])
    return plan.to_dict()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("micro_batch"), r"micro_batch: missing \(expected an integer\)"),
    (lambda d: d.update(micro_batch="16"), r"micro_batch: expected an integer, got '16'"),
    (lambda d: d.update(micro_batch=64), r"need 1 <= micro_batch <= effective_batch"),
    (lambda d: d["loader"].update(num_workers=-1), r"loader: num_workers must be an int >= 0"),
    (lambda d: d["loader"].update(pin_memory="yes"),
     r"loader\.pin_memory: expected true or false, got 'yes'"),
    (lambda d: d["decisions"][0].update(knob="warp"),
     r"decisions\[0\]\.knob: 'warp' is not a knob of the tuning path"),
    (lambda d: d["decisions"][0].update(p_value="low"),
     r"decisions\[0\]\.p_value: expected a number or null, got 'low'"),
    (lambda d: d["key"].pop("device"), r"key\.device: missing"),
    (lambda d: d.update(turbo=True), r"unknown field\(s\) 'turbo'"),
    (lambda d: d.update(precision="fp8"), r"precision must be one of"),
    (lambda d: d.update(torch_threads=0), r"torch_threads must be >= 1"),
])
def test_load_plan_checks_every_field_and_names_the_file(tmp_path: Path, change: Any,
                                                         message: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_plan_dict()))
    assert load_plan(good).micro_batch == 16
    d = _plan_dict()
    change(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(TunePlanError, match=rf"bad\.json is not a usable redline plan: .*{message}"):
        load_plan(bad)


def test_load_plan_names_a_file_that_is_not_text(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    p.write_bytes(b'{"schema": "\xff\xfe"}')
    with pytest.raises(TunePlanError, match=r"plan\.json is not UTF-8 text"):
        load_plan(p)
    save_plan(TunePlan.from_dict(_plan_dict()), p)
    assert load_plan(p).loader.num_workers == 2
