"""CUDA graphs as a kernel knob: the refusals (dynamic shapes, host reads of tensor values,
data-dependent shapes) found on the CPU by running one step under a dispatch spy, and the
knob measured and amortized like torch.compile (speeds faked: the capture itself runs in
benchmarks/gpu_check.py on a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.tune import TrainSetup
from redline.tune.config import TuneConfig
from redline.tune.cuda_graphs import dynamic_shapes, graph_blockers, graph_refusal
from redline.tune.knobs import TunePlan
from redline.tune.knobs.compile import COMPILE, COMPILE_RECORD, compile_trial
from redline.tune.knobs.cuda_graphs import CUDA_GRAPHS, CUDA_GRAPHS_RECORD
from redline.tune.path import TunePath, baseline_plan
from test_tune_path import speeds

THIS = Path(__file__).name


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Branchy(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.mean() > 0:  # a decision on a tensor's value, on the host
            y = y * 2
        return y


class Logs(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.last = y.abs().max().item()  # a host read every step
        return y


class Selects(Clean):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(x[:, 0] > 0).squeeze(1)  # as many rows as the data says
        return self.fc(x[keep]).sum(0, keepdim=True).expand(x.shape[0], 1)


def _loss(m: nn.Module, b: Any) -> torch.Tensor:
    return nn.functional.mse_loss(m(b[0]), b[1])


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)


def test_a_clean_step_has_no_blockers_and_its_gradients_are_cleared() -> None:
    m = Clean()
    assert graph_blockers(m, _batch(), _loss) == []
    assert all(p.grad is None for p in m.parameters())


def test_host_reads_and_data_dependent_shapes_are_named_with_their_line() -> None:
    (b,) = graph_blockers(Branchy(), _batch(), _loss)
    assert b.location.split(":")[0].endswith(THIS) and "host" in b.what and b.count == 1
    (b,) = graph_blockers(Logs(), _batch(), _loss)
    assert "(.item()" in b.what and b.location.split(":")[0].endswith(THIS)
    found = graph_blockers(Selects(), _batch(), _loss)
    assert any("torch.nonzero" in x.what for x in found), found
    why = graph_refusal([_batch()], graph_blockers(Logs(), _batch(), _loss))
    assert why is not None and "reads a tensor's value on the host" in why and THIS in why


def test_dynamic_shapes_refuse_and_a_short_last_batch_does_not() -> None:
    same = [(torch.zeros(4, 128), torch.zeros(4)), (torch.zeros(2, 128), torch.zeros(2))]
    assert dynamic_shapes(same) is None  # only the batch dimension differs
    varlen = [(torch.zeros(4, n), torch.zeros(4)) for n in (128, 96, 128, 64)]
    why = dynamic_shapes(varlen)
    assert why is not None and why.startswith("dynamic shapes: 3 different per-sample shapes")
    assert graph_refusal(varlen, []) == why and graph_refusal(same, []) is None


def _setup() -> TrainSetup:
    torch.manual_seed(0)
    m = Clean()
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g))
    return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.01),
                      loader=DataLoader(ds, batch_size=16), loss_fn=_loss, run_steps=10_000)


def _path(tmp_path: Path, rule: Any) -> tuple[TunePath, TunePlan]:
    cfg = TuneConfig(rounds=1, steps_per_trial=2, warmup_steps=1, reuse=False,
                     store_dir=str(tmp_path))
    p = TunePath(_setup, cfg, lambda s: None, speeds(rule))
    return p, baseline_plan(p.key, p.micro, p.effective, p.user_loader)


def test_graphs_are_kept_when_the_run_pays_for_the_recording(tmp_path: Path) -> None:
    # eager 10 ms, compiled 8 ms, replayed graphs 4 ms a step
    p, base = _path(tmp_path, lambda pl: 0.004 if pl.compile_mode else
                    0.008 if pl.compile else 0.010)
    plan = COMPILE.run(p, base)
    plan = compile_trial(p, plan, CUDA_GRAPHS_RECORD, mode="reduce-overhead")
    c, g = plan.decisions
    assert (c.knob, g.knob) == (COMPILE_RECORD.label, CUDA_GRAPHS_RECORD.label) and c.kept and g.kept
    assert plan.compile and plan.compile_mode == "reduce-overhead"
    assert "vs 80 s compiled" in g.reason and "recording the graphs" in g.reason
    assert g.samples_per_s_before == 2000 and g.samples_per_s_after == 4000


def test_graphs_that_fail_to_capture_are_recorded_not_kept(tmp_path: Path) -> None:
    def rule(pl: TunePlan) -> float:
        if pl.compile_mode:
            raise RuntimeError("operator not supported in a CUDA graph capture")
        return 0.01

    p, base = _path(tmp_path, rule)
    plan = compile_trial(p, base, CUDA_GRAPHS_RECORD, mode="reduce-overhead")
    (d,) = plan.decisions
    assert d.knob == CUDA_GRAPHS_RECORD.label and not d.kept and not plan.compile
    assert d.reason.startswith("failed: RuntimeError: operator not supported")


def test_off_cuda_graphs_are_not_tried(tmp_path: Path) -> None:
    p, base = _path(tmp_path, lambda pl: 0.01)
    assert CUDA_GRAPHS.run(p, base) is base and base.decisions == []
