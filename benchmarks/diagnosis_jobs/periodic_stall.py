"""LSTM character model that pushes its metrics to a tracking server every 10th step (blocking)."""

import argparse
import time

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

PUSH_EVERY = 10
VOCAB = 96


def push_metrics(metrics: dict) -> None:
    # a blocking HTTP round trip to the experiment tracker (its latency, here a fixed wait)
    time.sleep(0.4)


class CharLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 64)
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.out = nn.Linear(128, VOCAB)

    def forward(self, x):
        h, _ = self.lstm(self.emb(x))
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    text = torch.randint(0, VOCAB, (2048, 33))
    loader = DataLoader(TensorDataset(text), batch_size=args.batch_size, shuffle=True)
    model = CharLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    done = 0
    with training("periodic_stall"):
        while done < args.steps:
            for (seq,) in loader:
                with step(model):
                    logits = model(seq[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if done % PUSH_EVERY == 0:
                        push_metrics({"step": done, "loss": loss.item()})
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
