"""An unmodified Hugging Face Trainer script (nothing of redline in it): a GPT-2-shaped model
built from a config object (no download), gradient_accumulation_steps=2. Prints its own count
of optimizer steps."""

import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                   n_head=2))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=12, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2, report_to=[], save_strategy="no",
                         logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
print(f"SCRIPT optimizer steps: {trainer.state.global_step}", flush=True)
