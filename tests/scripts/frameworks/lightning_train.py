"""An unmodified Lightning script (nothing of redline in it): accumulate_grad_batches=2,
bf16-mixed, a DataLoader worker; with --manual, manual optimization stepping two optimizers per
iteration (as GANs do). Prints its own count of optimizer steps."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MANUAL = "--manual" in sys.argv


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.b = nn.Linear(4, 4)
        self.automatic_optimization = not MANUAL
        self.iterations = 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.b(self.a(x)), y)
        if MANUAL:
            opt_a, opt_b = self.optimizers()  # type: ignore[misc]
            opt_a.zero_grad()
            opt_b.zero_grad()
            self.manual_backward(loss)
            opt_a.step()
            opt_b.step()
            self.iterations += 1
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        if MANUAL:
            return [torch.optim.SGD(self.a.parameters(), lr=0.01),
                    torch.optim.SGD(self.b.parameters(), lr=0.01)]
        return torch.optim.SGD(self.parameters(), lr=0.01)


g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(512, 16, generator=g), torch.randint(0, 4, (512,), generator=g))
trainer = L.Trainer(accelerator="cpu", max_steps=12, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    accumulate_grad_batches=1 if MANUAL else 2,
                    precision="32-true" if MANUAL else "bf16-mixed")
model = Net()
trainer.fit(model, DataLoader(data, batch_size=8, num_workers=1, persistent_workers=True))
steps = model.iterations if MANUAL else trainer.global_step
print(f"SCRIPT optimizer steps: {steps}", flush=True)
