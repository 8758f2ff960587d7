"""A loop that catches everything around its step, and (with --fetch-too) around its fetch."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
fetch_too = "--fetch-too" in sys.argv
steps = 0
for _ in range(5):
    it = iter(loader)
    while True:
        try:
            x, y = next(it)
        except StopIteration:
            break
        except:
            if fetch_too:
                continue
            raise
        try:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
        except:  # noqa: E722
            pass
print(f"the script finished {steps} steps", flush=True)
