"""A tiny training script with redline tune factories (normal and broken ones)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.tune import TrainSetup


def _data(n: int = 256, scale: float = 1.0) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 16, generator=g) * scale, torch.randint(0, 4, (n,), generator=g))


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def redline_setup(limit: int | None = 2_000_000, width: int = 64) -> TrainSetup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.LayerNorm(width), nn.Linear(width, 4))
    return TrainSetup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                      loader=DataLoader(_data(), batch_size=4, shuffle=True, drop_last=True),
                      loss_fn=_loss, accumulation_steps=8, memory_limit_bytes=limit,
                      run_steps=500)


def raising_setup() -> TrainSetup:
    raise FileNotFoundError("/data/train.tar is missing")


def wrong_type_setup() -> dict:
    return {"model": None}


def huge_setup() -> TrainSetup:
    return redline_setup(limit=200_000, width=512)  # weights + Adam alone exceed the budget


def nan_setup() -> TrainSetup:
    s = redline_setup()
    s.loader = DataLoader(_data(scale=float("nan")), batch_size=4, shuffle=True, drop_last=True)
    return s


if __name__ == "__main__":
    raise SystemExit("this block must not run under redline tune")
