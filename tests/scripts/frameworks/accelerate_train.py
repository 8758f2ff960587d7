"""An unmodified loop under Accelerate (nothing of redline in it): gradient_accumulation_steps=2
through accelerator.accumulate(), where optimizer.step() is called every micro-batch and the
wrapped optimizer only steps on the last. Prints its own count of optimizer steps."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(192, 16, generator=g), torch.randint(0, 4, (192,), generator=g))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
steps = 0
for x, y in loader:
    with accelerator.accumulate(model):
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
print(f"SCRIPT optimizer steps: {steps}", flush=True)
