"""MLP classifier that computes a confusion matrix and per-class metrics over its last batches each step."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CLASSES = 20
WINDOW = 4


def batch_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    probs = logits.softmax(1).tolist()
    truth = labels.tolist()
    confusion = [[0] * CLASSES for _ in range(CLASSES)]
    top3 = 0
    for p, t in zip(probs, truth, strict=False):
        ranked = sorted(range(CLASSES), key=lambda c: -p[c])
        confusion[t][ranked[0]] += 1
        top3 += t in ranked[:3]
    precision, recall = [], []
    for c in range(CLASSES):
        tp = confusion[c][c]
        predicted = sum(confusion[r][c] for r in range(CLASSES))
        actual = sum(confusion[c])
        precision.append(tp / predicted if predicted else 0.0)
        recall.append(tp / actual if actual else 0.0)
    f1 = [2 * p * r / (p + r) if p + r else 0.0 for p, r in zip(precision, recall, strict=False)]
    # expected calibration error over 10 bins
    bins = [[0, 0.0, 0.0] for _ in range(10)]
    for p, t in zip(probs, truth, strict=False):
        conf = max(p)
        b = min(int(conf * 10), 9)
        bins[b][0] += 1
        bins[b][1] += conf
        bins[b][2] += p.index(conf) == t
    ece = sum(abs(s - c) for n, s, c in bins if n) / len(probs)
    # one-vs-rest ROC AUC per class, by ranks
    aucs = []
    for c in range(CLASSES):
        scored = sorted((p[c], t == c) for p, t in zip(probs, truth, strict=False))
        pos = sum(1 for _, is_pos in scored if is_pos)
        neg = len(scored) - pos
        rank_sum = sum(r + 1 for r, (_, is_pos) in enumerate(scored) if is_pos)
        if pos and neg:
            aucs.append((rank_sum - pos * (pos + 1) / 2) / (pos * neg))
    return {"top3": top3 / len(truth), "macro_f1": sum(f1) / CLASSES, "ece": ece,
            "macro_auc": sum(aucs) / max(len(aucs), 1)}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, CLASSES))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(16_384, 64), torch.randint(0, CLASSES, (16_384,))),
                        batch_size=args.batch_size, shuffle=True)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    window: list[tuple[torch.Tensor, torch.Tensor]] = []  # the last WINDOW batches
    done = 0
    with training("host_metrics"):
        while done < args.steps:
            for x, y in loader:
                with step(model):
                    logits = model(x)
                    loss = F.cross_entropy(logits, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    window = [*window[-(WINDOW - 1):], (logits.detach(), y)]
                    metrics = batch_metrics(torch.cat([w[0] for w in window]),
                                            torch.cat([w[1] for w in window]))
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f} f1 {metrics['macro_f1']:.3f}")


if __name__ == "__main__":
    main()
