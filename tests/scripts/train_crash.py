import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(100):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    if i == 11:
        raise ValueError("loss went NaN at step 12")
