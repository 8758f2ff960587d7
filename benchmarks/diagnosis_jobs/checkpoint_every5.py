"""Two-tower recommender (sparse embeddings + MLP) that checkpoints model and optimizers every few steps."""

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAVE_EVERY = 5
USERS, ITEMS, DIM = 60_000, 40_000, 64


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM, sparse=True)
        self.items = nn.Embedding(ITEMS, DIM, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, u, i):
        return self.mlp(torch.cat([self.users(u), self.items(i)], dim=1)).squeeze(-1)


def save_checkpoint(path: str, model: nn.Module, opts: list, step_no: int) -> None:
    torch.save({"step": step_no, "model": model.state_dict(),
                "optimizers": [o.state_dict() for o in opts]}, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    n = 65_536
    u = torch.randint(0, USERS, (n,))
    i = torch.randint(0, ITEMS, (n,))
    clicks = (torch.rand(n) < 0.1).float()
    loader = DataLoader(TensorDataset(u, i, clicks), batch_size=args.batch_size, shuffle=True)
    model = TwoTower()
    sparse_opt = torch.optim.SparseAdam(list(model.users.parameters()) + list(model.items.parameters()),
                                        lr=1e-3)
    dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)
    ckpt_dir = tempfile.mkdtemp()
    done = 0
    with training("checkpoint_every5"):
        while done < args.steps:
            for ub, ib, yb in loader:
                with step(model):
                    loss = F.binary_cross_entropy_with_logits(model(ub, ib), yb)
                    sparse_opt.zero_grad()
                    dense_opt.zero_grad()
                    loss.backward()
                    sparse_opt.step()
                    dense_opt.step()
                    if done % SAVE_EVERY == 0:
                        save_checkpoint(os.path.join(ckpt_dir, "last.pt"), model,
                                        [sparse_opt, dense_opt], done)
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
