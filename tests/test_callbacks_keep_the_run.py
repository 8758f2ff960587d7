"""The Lightning and Hugging Face callbacks never throw away the user's run: outputs that could
not be written are refused when the callback is built, before training; a report that cannot
be written at the end (a full disk) is a warning and the report printed, and ``fit``/``train``
return, so the script's own model save runs. The real frameworks, on CPU, on tiny models built
in code."""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import redline
from redline.integrations import IntegrationError
from redline.integrations import session as session_module
from redline.measure.config import WatchConfig

pytestmark = pytest.mark.slow


def _lightning() -> Any:
    return pytest.importorskip("redline.integrations.lightning")


def _hf() -> Any:
    return pytest.importorskip("redline.integrations.hf")


def _full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every report write fails as on a full disk."""
    def fail(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(session_module, "write_json", fail)
    monkeypatch.setattr(session_module, "write_html", fail)


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_outputs_that_cannot_be_written_are_refused_when_the_callback_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str) -> None:
    mod = _lightning() if framework == "lightning" else _hf()
    (tmp_path / "a-file").write_text("")
    for path, says in ((tmp_path, "is an existing directory"),
                       (tmp_path / "no" / "r.json", "does not exist"),
                       (tmp_path / "a-file" / "r.json", "is a file, not a directory"),
                       (Path("/proc/redline-r.json"), "a file cannot be made in '/proc'")):
        with pytest.raises(IntegrationError, match=f"json_path '{re.escape(str(path))}'.*{says}"):
            mod.RedlineCallback(json_path=str(path))
    with pytest.raises(IntegrationError, match=r"html_path .*is an existing directory"):
        mod.RedlineCallback(html_path=str(tmp_path))
    script = tmp_path / "train.py"
    script.write_text("# the user's script")
    monkeypatch.setattr(sys, "argv", [str(script)])
    with pytest.raises(IntegrationError, match=r"json_path .* is the running script"):
        mod.RedlineCallback(json_path=str(script))
    assert not list(tmp_path.glob(".redline-probe-*"))  # the write probe leaves nothing


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_config_as_a_dict_of_watch_fields(framework: str) -> None:
    mod = _lightning() if framework == "lightning" else _hf()
    cb = mod.RedlineCallback(config=WatchConfig(warmup_steps=1, count_flops=False))
    assert cb._config == WatchConfig(warmup_steps=1, count_flops=False)
    with pytest.raises(IntegrationError, match=r"config has no field 'warmup'; WatchConfig's "
                                               r"fields are: warmup_steps, max_steps"):
        mod.RedlineCallback(config={"warmup": 1})
    with pytest.raises(IntegrationError, match=r"config=\{'warmup_steps': -1\}: warmup_steps "
                                               r"must be >= 0"):
        mod.RedlineCallback(config={"warmup_steps": -1})
    with pytest.raises(IntegrationError, match=r"config must be a redline.WatchConfig, a dict "
                                               r"of its fields or None, got list"):
        mod.RedlineCallback(config=[("warmup_steps", 1)])


def _lightning_fit(tmp_path: Path, cb: Any) -> Path:
    """A tiny Lightning fit with ``cb``, then the script's own save; returns the saved path."""
    import lightning as L

    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
    trainer = L.Trainer(accelerator="cpu", max_steps=6, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        callbacks=[cb])
    model = Net()
    trainer.fit(model, DataLoader(data, batch_size=8))
    saved = tmp_path / "model.pt"
    torch.save(model.state_dict(), saved)  # the script's own next line
    return saved


class _Tokens(Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(8), "labels": torch.randn(2)}


class _HfNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


def _hf_train(tmp_path: Path, cb: Any) -> Path:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=6,
                             per_device_train_batch_size=8, report_to=[], save_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    model = _HfNet()
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=[cb])
    trainer.train()
    saved = tmp_path / "model.pt"
    torch.save(model.state_dict(), saved)
    return saved


@pytest.mark.parametrize("framework,show", [("lightning", True), ("lightning", False),
                                            ("hf", True)])
def test_a_full_disk_at_the_end_warns_prints_and_lets_the_script_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        framework: str, show: bool) -> None:
    mod = _lightning() if framework == "lightning" else _hf()
    out = tmp_path / "report.json"
    cb = mod.RedlineCallback(json_path=str(out), show=show,
                             config=WatchConfig(warmup_steps=1, count_flops=False))
    _full_disk(monkeypatch)
    with pytest.warns(RuntimeWarning, match=rf"report was not written to '{re.escape(str(out))}' \(OSError: "
                                            r"\[Errno 28\] No space left on device\)"):
        saved = (_lightning_fit if framework == "lightning" else _hf_train)(tmp_path, cb)
    assert saved.exists() and not out.exists()
    assert cb.report is not None and cb.report.measurements.timing.steps_measured == 5
    assert "redline · completed" in capsys.readouterr().out  # the report, printed


def test_a_report_that_cannot_be_built_does_not_raise_out_of_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _lightning()
    cb = mod.RedlineCallback(show=False, config=WatchConfig(warmup_steps=1, count_flops=False))

    def broken(self: Any, **kw: Any) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(redline.Watch, "report", broken)
    with pytest.warns(RuntimeWarning, match=r"could not be built \(ZeroDivisionError"):
        saved = _lightning_fit(tmp_path, cb)
    assert saved.exists() and cb.report is None
