"""A Hugging Face model, dataset and TrainingArguments as a `redline tune` factory
(redline_setup), and, run as a script, an HF Trainer run that applies a plan through
TrainingArguments: ``python hf_tune.py PLAN OUT`` trains 6 optimizer steps with the plan's
``hf_settings`` under redline's callback and writes the report to OUT/report.json."""

import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from redline.integrations.hf import hf_setup


class Tokens(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=2))


def redline_setup():  # type: ignore[no-untyped-def]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-tune-"),
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             report_to=[], use_cpu=True, save_strategy="no")
    return hf_setup(model(), Tokens(), args)


if __name__ == "__main__":
    from redline.integrations import hf_settings
    from redline.integrations.hf import RedlineCallback
    from redline.measure.config import WatchConfig
    from redline.tune import load_plan

    settings = hf_settings(load_plan(sys.argv[1]))
    args = TrainingArguments(output_dir=f"{sys.argv[2]}/hf", max_steps=6, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True,
                             **settings.arguments)
    trainer = Trainer(model=model(), args=args, train_dataset=Tokens())
    trainer.add_callback(RedlineCallback(trainer, f"{sys.argv[2]}/report.json",
                                         config=WatchConfig(warmup_steps=2, count_flops=False)))
    trainer.train()
