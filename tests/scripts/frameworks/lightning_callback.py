"""A Lightning script with redline's callback: accumulate_grad_batches=2, a CSV logger,
validation every 4 batches that takes 0.2 s per batch (which must not count as training), and
with --ddp the DDP strategy on 2 CPU processes (run under torchrun). Writes the report to argv[1]
and prints its own count of optimizer steps."""

import sys
import time

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.integrations.lightning import RedlineCallback
from redline.measure.config import WatchConfig

DDP = "--ddp" in sys.argv
out = sys.argv[1]


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> None:
        time.sleep(0.2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(512, 16, generator=g), torch.randint(0, 4, (512,), generator=g))
cb = RedlineCallback(json_path=f"{out}/report.json", html_path=f"{out}/report.html",
                     window_steps=4,
                     config=WatchConfig(warmup_steps=2, count_flops=False))
trainer = L.Trainer(accelerator="cpu", max_steps=12, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    accumulate_grad_batches=2, val_check_interval=4, limit_val_batches=2,
                    num_sanity_val_steps=0, log_every_n_steps=2,
                    logger=CSVLogger(out, name="csv", version=0), callbacks=[cb],
                    devices=2 if DDP else 1, strategy="ddp" if DDP else "auto")
trainer.fit(Net(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=4))
if trainer.global_rank == 0:
    print(f"SCRIPT optimizer steps: {trainer.global_step}", flush=True)
