"""Hugging Face ``transformers``: a callback that measures ``Trainer.train``, and a model,
dataset and ``TrainingArguments`` as a :class:`redline.tune.TrainSetup` for ``redline tune``.

    from redline.integrations.hf import RedlineCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    trainer.add_callback(RedlineCallback(trainer, json_path="redline.json"))
    trainer.train()                     # the report is printed and written when train ends

Needs transformers and accelerate (``pip install 'redline[hf]'``); importing this module
without them raises :class:`~redline.integrations.errors.MissingFrameworkError` with that hint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.report import Report
from redline.integrations.errors import IntegrationError, missing
from redline.integrations.session import FitWatch, end_metrics, watch_config
from redline.measure.config import WatchConfig
from redline.tune.setup import TrainSetup

try:
    from transformers import Trainer, TrainerCallback, TrainingArguments
except ImportError:
    raise missing("Hugging Face transformers", "transformers", "hf") from None

__all__ = ["RedlineCallback", "hf_setup"]


class RedlineCallback(TrainerCallback):  # type: ignore[misc]
    """Measures the training of ``Trainer.train`` with a :class:`redline.Watch`.

    A step ends at each ``on_step_end`` (an optimizer step: every
    ``gradient_accumulation_steps`` batches); evaluations and checkpoint saves inside train are
    left out of the steps. At the Trainer's logging steps, after warm-up, the metrics of the
    last ``window_steps`` measured steps (``redline/step_time_ms``, ``redline/data_wait_share``,
    …) are logged; when train ends the report is printed, written to ``json_path``, and its
    totals (``redline/findings``, ``redline/run_*``) logged. Under a multi-process launch every
    rank measures and rank 0 prints and writes the merged report.

    Given the ``trainer``, the metrics go through ``Trainer.log``, so every logger
    (``report_to``: TensorBoard, W&B, …) and ``trainer.state.log_history`` receive them.
    Without it (``Trainer(callbacks=[RedlineCallback()])``), they are added to the logs the
    Trainer sends, which only callbacks after this one see: the reporting integrations come
    before user callbacks, so pass the trainer for them.

    The Trainer has no hook for a failed ``train``: to get the report of a run that raised, use
    the callback as a context manager around ``trainer.train()``.

    Args:
        trainer: the Trainer it is added to (see above); None = add to the Trainer's logs.
        json_path: where the report's JSON is written (rank 0); None = not written.
        html_path: where the self-contained HTML report is written (rank 0; needs
            ``redline[html]``); None = not written.
        config: what the watch measures: a :class:`redline.WatchConfig` or a dict of its
            fields; its ``device`` defaults to the model's.

    The output paths are checked when the callback is built (an existing folder, a missing
    or read-only parent raise :class:`~redline.integrations.errors.IntegrationError` then,
    before training); a report that cannot be written when train ends (a full disk) is a
    warning naming the path and the error, with the report printed: it never raises out of
    ``train``, so the script's own next lines (saving the model) run.
        show: print the report at the end (rank 0).
        window_steps: measured steps the logged metrics are over.
        log_metrics: log the metrics during train; False = the report only.
    """

    def __init__(self, trainer: Trainer | None = None, json_path: str | None = None, *,
                 config: WatchConfig | Mapping[str, Any] | None = None, show: bool = True,
                 window_steps: int = 50, log_metrics: bool = True,
                 html_path: str | None = None) -> None:
        if trainer is not None and not isinstance(trainer, Trainer):
            raise IntegrationError(f"trainer must be a transformers.Trainer or None, got "
                                   f"{type(trainer).__name__}")
        self._trainer = trainer
        self._config = watch_config(config)
        self._fit = FitWatch(config=self._config, json_path=json_path, html_path=html_path,
                             show=show, window_steps=window_steps)
        self._log = log_metrics
        self._due = False
        self._sending = False
        self._train_loader: DataLoader[Any] | None = None

    @property
    def report(self) -> Report | None:
        """The report of the last train, once it ended."""
        return self._fit.report

    def __enter__(self) -> RedlineCallback:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._fit.end(ev)  # only still open when train raised

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any,
                       model: torch.nn.Module | None = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        cfg = self._config
        if cfg.device is None and model is not None:
            p = next(model.parameters(), None)
            if p is not None:
                cfg = dataclasses.replace(cfg, device=str(p.device))
        self._fit.config = cfg
        self._fit.begin()
        # Named the training loader once it was iterated (at the first step's end): the
        # report then describes it, not an evaluation loader.
        self._train_loader = train_dataloader if isinstance(train_dataloader, DataLoader) else None

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any,
                    **kwargs: Any) -> None:
        self._fit.step()
        if self._train_loader is not None:
            self._fit.training_loaders([self._train_loader])
            self._train_loader = None
        # The Trainer logs its loss after this hook when should_log is set; redline's metrics
        # follow in on_log (sending them here would use up the Trainer's own logging step).
        self._due = bool(control.should_log)

    def on_log(self, args: TrainingArguments, state: Any, control: Any,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if not (self._log and self._due and self._fit.running) or self._sending:
            return
        self._due = False
        metrics = self._fit.metrics()
        if not metrics:
            return
        if self._trainer is not None:
            self._send(metrics)
        elif logs is not None:
            logs.update(metrics)

    def on_evaluate(self, args: TrainingArguments, state: Any, control: Any,
                    **kwargs: Any) -> None:
        self._fit.skip()

    def on_save(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self._fit.skip()

    def on_train_end(self, args: TrainingArguments, state: Any, control: Any,
                     **kwargs: Any) -> None:
        totals = end_metrics(self._fit.end())
        if self._log and totals and self._trainer is not None:
            self._send(totals)

    def _send(self, metrics: dict[str, float]) -> None:
        assert self._trainer is not None
        self._sending = True  # Trainer.log calls every callback's on_log, this one too
        try:
            self._trainer.log(metrics)
        finally:
            self._sending = False


def hf_setup(model: torch.nn.Module, train_dataset: Any, args: TrainingArguments, *,
             data_collator: Any = None, run_steps: int | None = None,
             memory_limit_bytes: int | None = None) -> TrainSetup:
    """A model, its training dataset and ``TrainingArguments`` as the setup ``redline tune``
    measures, built the way ``Trainer`` builds them.

    The factory of ``redline tune train.py`` returns it::

        def redline_setup():
            args = TrainingArguments(output_dir="out", per_device_train_batch_size=8,
                                     gradient_accumulation_steps=4, report_to=[])
            return hf_setup(MyModel(config), dataset, args)

    The optimizer is the Trainer's own (``args.optim``, learning rate, weight decay and its
    parameter groups, from ``Trainer.create_optimizer``); the loader has the Trainer's dataset
    (unused columns removed) and collator, with ``per_device_train_batch_size`` and the
    ``dataloader_*`` settings of ``args``; the loss is ``model(**batch)``'s ``loss``, as the
    Trainer computes it. The baseline is fp32 (``bf16``/``fp16`` are knobs tune tries).
    Export the plan with :func:`redline.integrations.settings.hf_settings`.

    Raises:
        IntegrationError: an argument of the wrong type, or a Trainer that fails to build.
    """
    if not isinstance(args, TrainingArguments):
        raise IntegrationError(f"args must be transformers.TrainingArguments, got "
                               f"{type(args).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise IntegrationError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset,
                          data_collator=data_collator)
        optimizer = trainer.create_optimizer()
        built = trainer.get_train_dataloader()
    except Exception as e:
        raise IntegrationError(f"transformers.Trainer could not be built from these arguments:"
                               f" {type(e).__name__}: {e}") from e
    workers = args.dataloader_num_workers
    loader: DataLoader[Any] = DataLoader(
        built.dataset, batch_size=args.per_device_train_batch_size, shuffle=True,
        collate_fn=built.collate_fn, num_workers=workers,
        pin_memory=args.dataloader_pin_memory, drop_last=args.dataloader_drop_last,
        prefetch_factor=(args.dataloader_prefetch_factor or 2) if workers else None,
        persistent_workers=bool(args.dataloader_persistent_workers and workers))
    device = next(model.parameters()).device
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=_loss,
                      device=str(device), accumulation_steps=args.gradient_accumulation_steps,
                      run_steps=run_steps, memory_limit_bytes=memory_limit_bytes)


def _loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    out = model(**batch) if isinstance(batch, Mapping) else model(*batch)
    loss = out.get("loss") if isinstance(out, Mapping) else out[0]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise IntegrationError(
            f"{type(model).__name__} returned no scalar loss; give the batches labels (the "
            "Trainer's loss is model(**batch).loss)")
    return loss
