"""A Hugging Face Trainer script with redline's callback: a GPT-2-shaped model built from a
config object (no download), gradient_accumulation_steps=2, logging every 2 steps to a logger
callback registered before redline's (as report_to's integrations are), and an evaluation every
4 steps that takes ≥ 0.4 s (which must not count as training); runs under torchrun too.
Writes the report and the
logger's records to argv[1]; prints its own count of optimizer steps."""

import json
import sys
import time
from typing import ClassVar

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from redline.integrations.hf import RedlineCallback
from redline.measure.config import WatchConfig

out = sys.argv[1]


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, delay_s: float = 0.0) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.delay_s)
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class Logger(TrainerCallback):  # type: ignore[misc]
    """Stands for a reporting integration (TensorBoard, W&B): records what on_log receives."""

    records: ClassVar[list[dict[str, float]]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        Logger.records.append(dict(logs or {}))


model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                   n_head=2))
args = TrainingArguments(output_dir=f"{out}/hf", max_steps=12, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                         logging_strategy="steps", logging_steps=2, eval_strategy="steps",
                         eval_steps=4, per_device_eval_batch_size=4, use_cpu=True,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(256),
                  eval_dataset=Tokens(8, delay_s=0.05), callbacks=[Logger()])
cb = RedlineCallback(trainer, json_path=f"{out}/report.json", html_path=f"{out}/report.html",
                     window_steps=4,
                     config=WatchConfig(warmup_steps=2, count_flops=False))
trainer.add_callback(cb)
trainer.train()
if trainer.is_world_process_zero():
    with open(f"{out}/logged.json", "w") as f:
        json.dump({"logger": Logger.records, "log_history": trainer.state.log_history}, f)
    print(f"SCRIPT optimizer steps: {trainer.state.global_step}", flush=True)
