"""A loop that starves for data: every sample waits 4 ms on (simulated) storage, in the main
process (num_workers=0)."""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowStorage(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        time.sleep(0.004)
        return torch.full((64,), float(i % 10)), i % 10


loader = DataLoader(SlowStorage(), batch_size=8, shuffle=True)
model = nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in loader:
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
