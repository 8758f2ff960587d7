"""The same starved training (a dataset that spends ~1.5 ms of CPU per sample, a tiny model,
no workers) as a plain loop, under Lightning's Trainer, under Hugging Face's Trainer, or under
Accelerate: ``python starved.py plain|lightning|hf|accelerate [OUT]``. Nothing of redline in
it; `redline doctor` should find the same thing in each."""

import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MODE = sys.argv[1]
STEPS = 30


class Slow(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        end = time.thread_time() + 0.0015
        while time.thread_time() < end:  # decode/augment stand-in: CPU work, not a wait
            pass
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(32, generator=g), "labels": torch.randint(0, 4, (), generator=g)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


torch.manual_seed(0)
if MODE == "plain":
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, batch in enumerate(DataLoader(Slow(), batch_size=8)):
        model(**batch)["loss"].backward()
        opt.step()
        opt.zero_grad()
        if i + 1 == STEPS:
            break
elif MODE == "lightning":
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            return self.net(**batch)["loss"]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.Trainer(accelerator="cpu", max_steps=STEPS, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(
        Module(), DataLoader(Slow(), batch_size=8))
elif MODE == "hf":
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=STEPS,
                             per_device_train_batch_size=8, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
                             disable_tqdm=True)
    Trainer(model=Net(), args=args, train_dataset=Slow()).train()
else:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = Net()
    model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                     DataLoader(Slow(), batch_size=8))
    for i, batch in enumerate(loader):
        acc.backward(model(**batch)["loss"])
        opt.step()
        opt.zero_grad()
        if i + 1 == STEPS:
            break
