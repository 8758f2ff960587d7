"""PyTorch Lightning: a callback that measures ``Trainer.fit``, and a Lightning module with its
data as a :class:`redline.tune.TrainSetup` for ``redline tune``.

    from redline.integrations.lightning import RedlineCallback
    trainer = L.Trainer(..., callbacks=[RedlineCallback(json_path="redline.json")])
    trainer.fit(model, datamodule)      # the report is printed and written when fit ends

Needs Lightning (``pip install 'redline[lightning]'``); importing this module without it
raises :class:`~redline.integrations.errors.MissingFrameworkError` with that hint. The
``lightning`` package is used, or ``pytorch_lightning`` where only that one is installed.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.report import Report
from redline.integrations.errors import IntegrationError, missing
from redline.integrations.session import FitWatch, end_metrics, watch_config
from redline.measure.config import WatchConfig
from redline.tune.setup import TrainSetup

try:
    from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
except ImportError:
    try:
        from pytorch_lightning import (
            Callback,
            LightningDataModule,
            LightningModule,
            Trainer,
        )
    except ImportError:
        raise missing("PyTorch Lightning", "lightning", "lightning") from None

__all__ = ["RedlineCallback", "lightning_setup"]


class RedlineCallback(Callback):  # type: ignore[misc]
    """Measures the training of ``Trainer.fit`` with a :class:`redline.Watch`.

    A step ends where Lightning's ``global_step`` advanced (an optimizer step: under
    ``accumulate_grad_batches`` every N batches; with manual optimization, an iteration whose
    optimizers stepped); validation inside fit is left out of the steps. Every batch after
    warm-up, the metrics of the last ``window_steps`` measured steps are logged with
    ``pl_module.log_dict`` under ``redline/`` (so TensorBoard, CSV, W&B loggers get them at
    Lightning's ``log_every_n_steps``); when fit ends the report is printed, written to
    ``json_path``, and its totals (``redline/findings``, ``redline/run_*``) go to every logger.
    Under the DDP strategy every rank measures and rank 0 prints and writes the merged report.

    Args:
        json_path: where the report's JSON is written (rank 0); None = not written.
        html_path: where the self-contained HTML report is written (rank 0; needs
            ``redline[html]``); None = not written.
        config: what the watch measures (warm-up steps, FLOP counting, sampling period): a
            :class:`redline.WatchConfig` or a dict of its fields; its ``device`` defaults to
            the LightningModule's.

    The output paths are checked when the callback is built (an existing folder, a missing
    or read-only parent raise :class:`~redline.integrations.errors.IntegrationError` then,
    before training); a report that cannot be written when fit ends (a full disk) is a
    warning naming the path and the error, with the report printed: it never raises out of
    ``fit``, so the script's own next lines (saving the model) run.
        show: print the report at the end (rank 0).
        window_steps: measured steps the logged metrics are over.
        log_metrics: log the metrics during fit; False = the report only.
    """

    def __init__(self, json_path: str | None = None, *,
                 config: WatchConfig | Mapping[str, Any] | None = None, show: bool = True,
                 window_steps: int = 50, log_metrics: bool = True,
                 html_path: str | None = None) -> None:
        super().__init__()
        self._config = watch_config(config)
        self._fit = FitWatch(config=self._config, json_path=json_path, html_path=html_path,
                             show=show, window_steps=window_steps)
        self._log = log_metrics
        self._global_step = 0

    @property
    def report(self) -> Report | None:
        """The report of the last fit, once it ended."""
        return self._fit.report

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Entered before Lightning builds its loaders' iterators (fit's data setup), so the
        # watch sees the training loader's settings and workers; what runs until the first
        # training batch (the validation sanity check) is left out at on_train_start.
        if stage != "fit":
            return
        cfg = self._config
        if cfg.device is None:
            cfg = dataclasses.replace(cfg, device=str(trainer.strategy.root_device))
        self._fit.config = cfg
        self._global_step = trainer.global_step
        self._fit.begin()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit.skip()
        self._global_step = trainer.global_step

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit.training_loaders(_loaders(trainer.train_dataloader))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self._global_step:
            return  # accumulating: no optimizer step in this batch
        self._global_step = trainer.global_step
        self._fit.step()
        if self._log:
            metrics = self._fit.metrics()
            if metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit.skip()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rep = self._fit.end()
        totals = end_metrics(rep)
        if totals and self._log:
            for logger in trainer.loggers:
                logger.log_metrics(totals, step=trainer.global_step)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._fit.end()  # a fit that ended without training (no on_train_end)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule,
                     exception: BaseException) -> None:
        self._fit.end(exception)


def _loaders(x: Any) -> list[DataLoader[Any]]:
    """The DataLoaders in what ``trainer.train_dataloader`` holds (one, or a collection)."""
    if isinstance(x, DataLoader):
        return [x]
    if isinstance(x, Mapping):
        return [d for v in x.values() for d in _loaders(v)]
    if isinstance(x, Sequence) and not isinstance(x, str):
        return [d for v in x for d in _loaders(v)]
    return []


def lightning_setup(module: LightningModule,
                    data: LightningDataModule | DataLoader[Any], *,
                    accumulate_grad_batches: int = 1, device: str = "cpu",
                    run_steps: int | None = None,
                    memory_limit_bytes: int | None = None) -> TrainSetup:
    """A LightningModule and its training data as the setup ``redline tune`` measures.

    The factory of ``redline tune train.py`` returns it::

        def redline_setup():
            return lightning_setup(MyModule(), MyDataModule(), accumulate_grad_batches=2)

    ``training_step(batch, batch_idx)`` is the loss (a tensor, or a dict with ``"loss"``,
    mean-reduced); ``configure_optimizers`` must return one optimizer (with or without
    schedulers, which the short trials do not step). The baseline is fp32 (``precision=
    "32-true"``): mixed precision is one of the knobs tune tries. Export the plan with
    :func:`redline.integrations.settings.lightning_settings`.

    Raises:
        IntegrationError: manual optimization, several optimizers, a training_step that
            returns no loss, or data that is not a DataLoader.
    """
    if not isinstance(module, LightningModule):
        raise IntegrationError(f"module must be a LightningModule, got {type(module).__name__}")
    if not module.automatic_optimization:
        raise IntegrationError(
            f"{type(module).__name__} uses manual optimization (automatic_optimization=False):"
            " its training_step steps the optimizers itself, so redline cannot split or time "
            "it; tune a plain-loop factory instead, or measure it with RedlineCallback")
    module = module.to(device)
    optimizer = _one_optimizer(module)
    loader = _train_loader(data)
    return TrainSetup(model=module, optimizer=optimizer, loader=loader, loss_fn=_loss,
                      device=device, accumulation_steps=accumulate_grad_batches,
                      run_steps=run_steps, memory_limit_bytes=memory_limit_bytes)


def _loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        # training_step's self.log() has no Trainer to log to here: Lightning warns and skips
        warnings.filterwarnings("ignore", message=".*self.log.*trainer.*")
        out = model.training_step(batch, 0)  # type: ignore[operator]
    if isinstance(out, Mapping):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor):
        raise IntegrationError(
            f"{type(model).__name__}.training_step returned {type(out).__name__}; redline "
            "needs the loss (a tensor, or a dict with 'loss')")
    return out


def _one_optimizer(module: LightningModule) -> torch.optim.Optimizer:
    try:
        conf = module.configure_optimizers()
    except Exception as e:
        raise IntegrationError(
            f"{type(module).__name__}.configure_optimizers() raised {type(e).__name__}: {e}; "
            "redline calls it without a Trainer attached (self.trainer is not available)"
        ) from e
    found: list[torch.optim.Optimizer] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.optim.Optimizer):
            found.append(x)
        elif isinstance(x, Mapping):
            walk(x.get("optimizer"))
        elif isinstance(x, Sequence) and not isinstance(x, str):
            for item in x:
                walk(item)

    walk(conf)
    if len(found) != 1:
        raise IntegrationError(
            f"{type(module).__name__}.configure_optimizers() gave {len(found)} optimizers; "
            "redline tune needs exactly one (the step it times is one optimizer step)")
    return found[0]


def _train_loader(data: LightningDataModule | DataLoader[Any]) -> DataLoader[Any]:
    if isinstance(data, DataLoader):
        return data
    if not isinstance(data, LightningDataModule):
        raise IntegrationError(f"data must be a LightningDataModule or a DataLoader, got "
                               f"{type(data).__name__}")
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    if not isinstance(loader, DataLoader):
        raise IntegrationError(
            f"{type(data).__name__}.train_dataloader() returned {type(loader).__name__}; "
            "redline tune needs one torch DataLoader")
    return loader
