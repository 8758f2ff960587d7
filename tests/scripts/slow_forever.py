import time

import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
i = 0
while True:
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    i += 1
    if i == 12:
        print("READY", flush=True)
    time.sleep(0.02)
