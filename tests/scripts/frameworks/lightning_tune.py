"""A LightningModule and LightningDataModule as a `redline tune` factory (redline_setup), and,
run as a script, a Lightning training that applies a plan through Lightning's own settings:
``python lightning_tune.py PLAN OUT`` trains 8 optimizer steps with the plan's
``lightning_settings`` under redline's callback and writes the report to OUT/report.json."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.integrations.lightning import lightning_setup


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 10)}


class Data(L.LightningDataModule):
    def __init__(self, **loader_kwargs: object) -> None:
        super().__init__()
        self.loader_kwargs = {"batch_size": 8, **loader_kwargs}

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        self.ds = TensorDataset(torch.randn(1024, 32, generator=g),
                                torch.randint(0, 4, (1024,), generator=g))

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        return DataLoader(self.ds, shuffle=True, **self.loader_kwargs)  # type: ignore[arg-type]


def redline_setup():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return lightning_setup(Net(), Data(), accumulate_grad_batches=2)


if __name__ == "__main__":
    from redline.integrations import lightning_settings
    from redline.integrations.lightning import RedlineCallback
    from redline.measure.config import WatchConfig
    from redline.tune import load_plan

    settings = lightning_settings(load_plan(sys.argv[1]))
    cb = RedlineCallback(json_path=f"{sys.argv[2]}/report.json",
                         config=WatchConfig(warmup_steps=2, count_flops=False))
    trainer = L.Trainer(accelerator="cpu", max_steps=8, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                        **settings.arguments)
    trainer.fit(Net(), Data(**settings.dataloader))
