"""A plain training loop that prints a line every 5 steps (to stdout, and every 20th to
stderr) and takes ~30 ms a step, so a live panel is redrawn several times while it runs."""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(8 * int(sys.argv[1]), 16), torch.randint(0, 4, (8 * int(sys.argv[1]),)))
for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
    time.sleep(0.03)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if i % 5 == 0:
        print(f"script line {i}", flush=True)
    if i % 20 == 0:
        print(f"script warning {i}", file=sys.stderr, flush=True)
print("script done", flush=True)
