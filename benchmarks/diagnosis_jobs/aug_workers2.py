"""Small CNN on 32x32 images with a per-sample augmentation pipeline in the Dataset, two loader workers."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, Dataset


class AugmentedImages(Dataset):
    def __init__(self, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.blur = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = F.pad(self.images[i][None], (4, 4, 4, 4), mode="reflect")[0]
        y0, x0 = torch.randint(0, 9, (2,)).tolist()
        img = img[:, y0:y0 + 32, x0:x0 + 32]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        # colour jitter, then a few passes of a separable blur, one channel row at a time
        img = img * (0.8 + 0.4 * torch.rand(3, 1, 1)) + 0.1 * (torch.rand(3, 1, 1) - 0.5)
        for _ in range(6):
            k = self.blur.view(1, 1, 1, 5).expand(3, 1, 1, 5)
            img = F.conv2d(F.pad(img[None], (2, 2, 0, 0), mode="replicate"), k, groups=3)[0]
            k = self.blur.view(1, 1, 5, 1).expand(3, 1, 5, 1)
            img = F.conv2d(F.pad(img[None], (0, 0, 2, 2), mode="replicate"), k, groups=3)[0]
        img = (img - img.mean(dim=(1, 2), keepdim=True)) / (img.std(dim=(1, 2), keepdim=True) + 1e-5)
        return img, self.labels[i]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(AugmentedImages(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    done = 0
    with training("aug_workers2"):
        while done < args.steps:
            for x, y in loader:
                with step(model):
                    loss = F.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
