"""LSTM text classifier; the collate_fn tokenises, maps and pads each batch in pure Python."""

import argparse
import itertools
import random

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 5000
MAX_LEN = 64
WORDS = [f"w{i}" for i in range(VOCAB)]


class Reviews(Dataset):
    def __init__(self, n: int = 1024) -> None:
        rnd = random.Random(0)
        self.texts = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(300, 900)))
                      for _ in range(n)]
        self.labels = [rnd.randint(0, 1) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int):
        return self.texts[i], self.labels[i]


def word_id(word: str) -> int:
    # a hand-rolled string hash into the vocabulary
    h = 0
    for ch in word:
        h = (h * 31 + ord(ch)) % 1_000_003
    return h % VOCAB


def collate(batch):
    ids, masks, labels = [], [], []
    for text, label in batch:
        words = [w.lower().strip(".,!?") for w in text.split()]
        tokens = [word_id(w) for w in words]
        # word bigrams hashed into the same table, interleaved with the unigrams
        bigrams = [word_id(a + "_" + b) for a, b in itertools.pairwise(words)]
        tokens = [t for pair in zip(tokens, bigrams, strict=False) for t in pair]
        tokens = tokens[:MAX_LEN]
        pad = MAX_LEN - len(tokens)
        ids.append(tokens + [0] * pad)
        masks.append([1.0] * len(tokens) + [0.0] * pad)
        labels.append(label)
    return torch.tensor(ids), torch.tensor(masks), torch.tensor(labels)


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 48, batch_first=True)
        self.head = nn.Linear(48, 2)

    def forward(self, ids, mask):
        out, _ = self.lstm(self.emb(ids))
        pooled = (out * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Reviews(), batch_size=args.batch_size, shuffle=True, collate_fn=collate)
    model = LSTMClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done = 0
    with training("slow_collate"):
        while done < args.steps:
            for ids, mask, y in loader:
                with step(model):
                    loss = F.cross_entropy(model(ids, mask), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
