"""Small CNN on 28x28 digits-like images with a validation pass every few steps inside the loop."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EVAL_EVERY = 10


class DigitCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def evaluate(model: nn.Module, loader: DataLoader, max_batches: int = 30) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for b, (x, y) in enumerate(loader):
            if b >= max_batches:
                break
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(8192, 1, 28, 28), torch.randint(0, 10, (8192,)))
    val = TensorDataset(torch.randn(2048, 1, 28, 28), torch.randint(0, 10, (2048,)))
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val, batch_size=args.batch_size)
    model = DigitCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    done = 0
    with training("eval_every10"):
        while done < args.steps:
            for x, y in train_loader:
                with step(model):
                    loss = F.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if done % EVAL_EVERY == 0:
                        acc = evaluate(model, val_loader)
                        print(f"step {done} loss {loss.item():.3f} val_acc {acc:.3f}")
                done += 1
                if done >= args.steps:
                    break


if __name__ == "__main__":
    main()
