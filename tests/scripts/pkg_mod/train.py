import sys

import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
for _ in range(12):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print(f"module main={__name__} argv={sys.argv}")
