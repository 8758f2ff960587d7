"""Trains a few steps, then fails with a message full of square brackets (as gloo's do)."""

import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(6):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
raise RuntimeError("[/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed "
                   "by peer [127.0.0.1]:62160 [bold]")
