"""A plain training loop that, halfway, scrapes the metrics endpoint `redline doctor
--metrics-port PORT` serves for it (argv[1]) and prints the response between markers."""

import sys
import urllib.request

import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(640, 16), torch.randint(0, 4, (640,)))
for i, (x, y) in enumerate(DataLoader(data, batch_size=8)):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if i == 20:
        body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10)
        print("SCRAPE-BEGIN\n" + body.read().decode() + "SCRAPE-END", flush=True)
