"""Nothing redline does breaks or throws away the user's run: the script imported without
running it, the optimizer the loop steps kept (with its schedulers), and the user's mistakes
answered with a sentence instead of a traceback."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import redline
from factories import plan_key
from redline.cli.main import main
from redline.runs import watch as watch_module
from redline.tune import (
    SetupError,
    TrainSetup,
    TuneConfig,
    TunePlan,
    TunePlanError,
    TunePlanMismatchError,
    apply_plan,
    load_factory,
    tune,
)
from redline.tune import setup as tune_setup
from redline.tune.result import TrialMetrics, TuneResult

# -- the user's script is imported, never run ----------------------------------------------

UNGUARDED = '''\
"""Trains at import."""
import torch
from redline.tune import TrainSetup

EPOCHS = 3


def redline_setup() -> TrainSetup:
    raise AssertionError("never reached")


model = torch.nn.Linear(4, 1)
with open("model.pt", "w") as f:
    f.write("overwritten")
'''


def test_a_script_that_trains_at_import_is_refused_before_it_runs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    (tmp_path / "model.pt").write_text("the user's weights")
    r = subprocess.run([sys.executable, "-m", "redline.cli.main", "tune", str(script)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{script}:12 runs when the script is imported: `model = torch.nn.Linear(4, 1)`" \
        in r.stderr
    assert 'Put the training under `if __name__ == "__main__":`' in r.stderr
    assert (tmp_path / "model.pt").read_text() == "the user's weights"  # nothing ran
    # `redline plan` loads scripts the same way
    assert main(["plan", str(script), "--gpus", "2", "--global-batch", "8"]) == 2
    assert (tmp_path / "model.pt").read_text() == "the user's weights"


@pytest.mark.parametrize("source,line", [
    ("import torch\ntorch.save({}, 'model.pt')\n", 2),
    ("x = 1\nfor i in range(3):\n    pass\n", 2),
    ("def f():\n    pass\n\n\nf()\n", 5),
    ("if True:\n    main()\n", 1),
    ("try:\n    import lightning\nexcept ImportError:\n    train()\n", 1),
    ("@register(open('log', 'w'))\ndef f():\n    pass\n", 1),
    ("class C:\n    data = open('log', 'w')\n", 1),
    ("def f(data=load()):\n    pass\n", 1),
    ("import sys\nsys.exit(3)\n", 2),
    ("print('hello')\n", 1),
])
def test_work_at_import_is_found_at_its_first_line(source: str, line: int) -> None:
    found = tune_setup.unguarded_line(source)
    assert found is not None and found[0] == line


def test_a_script_that_only_defines_and_sets_up_is_loaded(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text('''\
"""Defines only."""
from __future__ import annotations
import logging, os, sys
from pathlib import Path
from typing import TYPE_CHECKING
import torch
if TYPE_CHECKING:
    from redline.tune import TrainSetup
try:
    import lightning  # noqa: F401
except ImportError:
    lightning = None
sys.path.insert(0, os.path.dirname(__file__))
log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIZES: dict[str, int] = {"a": 1}
os.environ["OMP_NUM_THREADS"] = "1"
loss = lambda m, b: m(b).sum()  # noqa: E731
torch.manual_seed(0)


def redline_setup(width: int = int("4")) -> "TrainSetup":
    return None  # type: ignore[return-value]


if __name__ == "__main__":
    torch.save({}, "model.pt")
''')
    assert tune_setup.unguarded_line(script.read_text()) is None
    assert callable(load_factory(str(script)))


def test_a_script_that_is_not_python_is_named(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n")
    with pytest.raises(SetupError, match=r"broken.py is not valid Python: line 1"):
        load_factory(str(script))


# -- apply_plan keeps the optimizer the loop steps ----------------------------------------

def _pieces(lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    m = nn.Linear(8, 2)
    ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    return m, torch.optim.SGD(m.parameters(), lr=lr), DataLoader(ds, batch_size=8)


def _mse(model: nn.Module, b: Any) -> torch.Tensor:
    return nn.functional.mse_loss(model(b[0]), b[1])


def _rates_used(opt: torch.optim.Optimizer) -> list[float]:
    """The rate of each step the optimizer takes, read as it steps."""
    seen: list[float] = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append(o.param_groups[0]["lr"]))
    return seen


def _batches(tuned: Any, n: int) -> list[Any]:
    """``n`` batches of the tuned loader, epoch after epoch."""
    out: list[Any] = []
    while len(out) < n:
        out += list(tuned.loader)
    return out[:n]


def test_a_scheduler_built_before_apply_plan_drives_the_optimizer_the_loop_steps() -> None:
    m, opt, loader = _pieces()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    plan = TunePlan(key=plan_key(), effective_batch=8, micro_batch=8, optimizer_impl="foreach")
    tuned = apply_plan(plan, m, opt, loader, _mse, check=False)
    assert tuned.optimizer is opt and opt.defaults["foreach"] is True
    assert all(g["foreach"] is True for g in opt.param_groups)
    seen = _rates_used(tuned.optimizer)
    for batch in _batches(tuned, 3):
        tuned.step(batch)
        sched.step()
    assert seen == pytest.approx([0.1, 0.05, 0.025])  # the scheduled rates, step by step


def test_switching_the_implementation_after_a_step_is_refused_with_what_to_do() -> None:
    m, _, loader = _pieces()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    _mse(m, next(iter(loader))).backward()
    opt.step()  # momentum buffers: state kept per implementation
    with pytest.raises(TunePlanError, match=r"already stepped.*call apply_plan before"):
        apply_plan(TunePlan(key=plan_key(), effective_batch=8, micro_batch=8,
                            optimizer_impl="foreach"), m, opt, loader, _mse, check=False)


def _scaled_plan() -> TunePlan:
    return TunePlan(key=plan_key(), effective_batch=32, micro_batch=32, user_effective_batch=8,
                    lr_scale=4.0, lr_rule="linear", lr_warmup_steps=2)


def test_a_scaled_rate_with_a_scheduler_built_before_is_refused_unless_passed() -> None:
    m, opt, loader = _pieces()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.9 ** k)
    with pytest.raises(TunePlanMismatchError, match=r"× 4 .*a learning-rate scheduler was already"
                                                r".*schedulers=\[your_scheduler\]"):
        apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False)
    tuned = apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False, schedulers=[sched])
    seen = _rates_used(tuned.optimizer)
    for batch in _batches(tuned, 5):
        tuned.step(batch)
        sched.step()
    # warm-up from the user's rate over 2 steps, then the schedule on the scaled rate
    assert seen[:3] == pytest.approx([0.1, 0.25, 0.4])
    assert seen[3:] == pytest.approx([0.4 * 0.9 ** 3, 0.4 * 0.9 ** 4])


def test_a_scheduler_built_after_apply_plan_schedules_the_scaled_rate() -> None:
    m, opt, loader = _pieces()
    tuned = apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False)
    sched = torch.optim.lr_scheduler.LambdaLR(tuned.optimizer, lambda k: 0.5 ** k)
    seen = _rates_used(tuned.optimizer)
    for batch in _batches(tuned, 4):
        tuned.step(batch)
        sched.step()
    assert seen[0] == pytest.approx(0.1)  # the warm-up starts at the user's rate
    assert seen[3] == pytest.approx(0.4 * 0.5 ** 3)  # after it: the schedule of 0.1 × 4


def test_a_rate_scaling_plan_applied_twice_scales_once() -> None:
    m, opt, loader = _pieces()
    apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False)
    tuned = apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False)
    sched = torch.optim.lr_scheduler.LambdaLR(tuned.optimizer, lambda k: 1.0)
    seen = _rates_used(tuned.optimizer)
    for batch in _batches(tuned, 4):
        tuned.step(batch)
        sched.step()
    assert seen[-1] == pytest.approx(0.4)  # 0.1 × 4, not × 16


def test_a_scheduler_of_another_optimizer_is_refused() -> None:
    m, opt, loader = _pieces()
    _, other, _ = _pieces()
    sched = torch.optim.lr_scheduler.StepLR(other, step_size=1)
    with pytest.raises(TunePlanMismatchError, match="built on another optimizer"):
        apply_plan(_scaled_plan(), m, opt, loader, _mse, check=False, schedulers=[sched])


# -- the user's mistakes under tune: a sentence, not a traceback --------------------------

def _cfg(tmp_path: Path) -> TuneConfig:
    return TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, numerics_steps=2,
                      tune_loader=False, tune_batch=False, tune_kernels=False,
                      store_dir=str(tmp_path / "plans"))


def _setup(loss: Any = _mse, data: Dataset[Any] | None = None, workers: int = 0) -> TrainSetup:
    m, opt, loader = _pieces()
    return TrainSetup(model=m, optimizer=opt, loss_fn=loss,
                      loader=DataLoader(data if data is not None else loader.dataset,
                                        batch_size=8, num_workers=workers))


def test_a_loss_without_grad_is_refused_by_name(tmp_path: Path) -> None:
    def detached(model: nn.Module, b: Any) -> torch.Tensor:
        return _mse(model, b).detach()

    with pytest.raises(SetupError, match=r"loss_fn \(.*detached\) returned a loss that does "
                                         r"not require grad.*\.detach\(\)"):
        tune(lambda: _setup(detached), _cfg(tmp_path))


class _Broken(Dataset[Any]):
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise KeyError(f"sample {i} is missing")
        return torch.randn(8), torch.randn(2)


def test_a_dataset_that_raises_under_tune_is_named_with_its_index(tmp_path: Path) -> None:
    with pytest.raises(SetupError) as e:
        tune(lambda: _setup(data=_Broken(13)), _cfg(tmp_path))
    msg = str(e.value)
    assert msg.startswith("reading _Broken[13] raised KeyError: 'sample 13 is missing' ("), msg
    assert "run the script alone" in msg and "Traceback" not in msg


def test_a_dataset_that_raises_in_a_worker_under_tune_is_named(tmp_path: Path) -> None:
    # sample 60 is first read by the trials' loader worker (the checks read the first 16)
    cfg = dataclasses.replace(_cfg(tmp_path), steps_per_trial=8)
    with pytest.raises(SetupError) as e:
        tune(lambda: _setup(data=_Broken(60), workers=1), cfg)
    msg = str(e.value)
    assert msg.startswith("reading a sample (read in a DataLoader worker, which does not say "
                          "its index) raised KeyError: 'sample 60 is missing' (File "), msg
    assert "in __getitem__" in msg


class _Stream(torch.utils.data.IterableDataset[Any]):
    def __iter__(self) -> Any:
        for _ in range(64):
            yield torch.randn(8), torch.randn(2)


@pytest.mark.parametrize("loader,says", [
    (DataLoader(_Stream(), batch_size=8), "reads an IterableDataset (_Stream)"),
    (DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 2)), batch_size=8,
                sampler=torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)),
     "uses a WeightedRandomSampler"),
])
def test_a_loader_tune_cannot_rebuild_is_refused_before_any_trial(tmp_path: Path, loader: Any,
                                                                  says: str) -> None:
    def factory() -> TrainSetup:
        s = _setup()
        s.loader = loader
        return s

    with pytest.raises(SetupError, match=rf"TrainSetup.loader {re.escape(says)}.*redline "
                                         "doctor"):
        tune(factory, _cfg(tmp_path))


def test_report_on_a_watch_never_entered_says_what_to_do() -> None:
    w = redline.Watch()
    with pytest.raises(watch_module.WatchUsageError,
                       match=r"never entered.*with redline.watch\(\) as w"):
        w.report()
    with w, pytest.raises(watch_module.WatchUsageError, match=r"after the `with redline\.watch"):
        w.report()
    assert w.report(show=False).status == "no_steps"


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_metrics_port_out_of_range_is_refused_up_front(port: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--metrics-port", port, "--", "python", "-c", "pass"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--metrics-port must be 0..65535 (a TCP port; 0 = any free one), got {port}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("warmup", [1, 2, 3])
def test_the_warm_up_asked_for_is_the_warm_up_reported(warmup: int) -> None:
    m, opt, _ = _pieces()
    with redline.watch(warmup_steps=warmup, count_flops=False) as w:
        for _ in range(10):
            _mse(m, (torch.randn(4, 8), torch.randn(4, 2))).backward()
            opt.step()
    t = w.report(show=False).measurements.timing
    assert (t.steps_warmup, t.steps_excluded, t.steps_measured) == (warmup, 0, 10 - warmup)


def _trial(tp: float, step_s: float, times: list[float]) -> TrialMetrics:
    return TrialMetrics(label="x", throughput_samples_per_s=tp, step_time_s=step_s,
                        data_wait_fraction=None, device_busy_fraction=None, mfu=None,
                        peak_memory_bytes=None, peak_memory_source="", energy_j_per_step=None,
                        energy_source="", steps=len(times), wall_s=1.0,
                        step_times_s=times)


def test_the_before_after_table_states_one_speed_up() -> None:
    from redline.report.tune_render import rows, to_dict
    from redline.tune.result import project

    # a skewed trial: one slow step makes the mean (what throughput is) and the median differ
    before = _trial(8 / 0.04, 0.02, [0.02, 0.02, 0.08])
    after = _trial(8 / 0.01, 0.009, [0.009, 0.009, 0.012])
    plan = TunePlan(key=plan_key(), effective_batch=8, micro_batch=8)
    res = TuneResult(plan=plan, before=before, after=after,
                     before_projection=project(before, 100, None, samples_per_step=8),
                     after_projection=project(after, 100, None, samples_per_step=8),
                     run_steps_source="test", price_per_device_hour=None)
    table = {r[0]: r for r in rows(res)}
    assert table["throughput (samples/s)"][3] == "4.00×"
    assert table["job time (100 steps)"][3] == "4.00× faster"
    assert res.before_projection.job_time_s == pytest.approx(100 * 0.04)
    assert to_dict(res)["speedup"] == pytest.approx(4.0)


def test_tune_states_the_same_speed_up_in_throughput_and_job_time(tmp_path: Path) -> None:
    from redline.report.tune_render import rows

    res = tune(lambda: _setup(), dataclasses.replace(_cfg(tmp_path), steps_per_trial=6))
    table = {r[0].split(" (")[0]: r[3] for r in rows(res)}
    assert res.speedup is not None
    assert table["job time"] == f"{res.speedup:.2f}× faster" == f"{table['throughput']} faster"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"metrics_port": 99999}, "metrics_port must be 0..65535"),
    ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
    ({"stack_sample_interval_s": 5.0}, "stack_sample_interval_s must be within"),
])
def test_a_watch_setting_out_of_range_is_a_redline_error_naming_the_field(
        kwargs: dict[str, Any], field: str) -> None:
    import redline
    from redline.measure.config import WatchConfigError

    with pytest.raises(WatchConfigError, match=field) as err:
        redline.watch(**kwargs)
    assert isinstance(err.value, redline.RedlineError) and isinstance(err.value, ValueError)
    assert str(next(iter(kwargs.values()))) in str(err.value)  # the value received
