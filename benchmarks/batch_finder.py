"""Batch finder vs Lightning's BatchSizeFinder, Accelerate's find_executable_batch_size and
Hugging Face's Trainer(auto_find_batch_size=True), under the same simulated device-memory budget
(redline.tune.MemoryBudget) on CPU.

Every tool runs in a fresh process; the true maximum comes from bisection over fresh processes
(one per probed batch, two steps each: the second with optimizer state). Reported per model:
batch found, % of the true max, trials (distinct batch sizes run), OOMs, wall time.

Needs lightning, transformers and accelerate, which redline does not depend on; the test
set-up (scripts/test) installs the versions tested in .venv:

    .venv/bin/python benchmarks/batch_finder.py The suite: an MLP
with dropout, a GPT with hand-written attention (`lm`), an LSTM, nn.TransformerEncoder, a conv
net with BatchNorm, a GRU over variable-length packed sequences, a model whose op sequence
changes with the batch (chunks above 32), a ViT with hand-written attention and dropout.
Target: ≥ 98 % of the true maximum, ≤ 4 trials, 0 out-of-memory trials, on every model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch
from torch import nn

from redline.tune.memory_budget import MemoryBudget

LIMITS = {"mlp": 300 * 2**20, "lm": 256 * 2**20, "lstm": 96 * 2**20,
          "transformer": 96 * 2**20, "conv-bn": 128 * 2**20, "varlen-gru": 48 * 2**20,
          "chunked": 64 * 2**20, "vit-dropout": 160 * 2**20}
"""Simulated device memory per model (the largest batch each allows is printed by the run):
each chosen so the true maximum lies between 20 and 5,000 samples."""
START = 8192


class CountingBudget(MemoryBudget):
    ooms = 0

    def _track(self, t: torch.Tensor, check: bool = True) -> None:
        try:
            super()._track(t, check)
        except torch.OutOfMemoryError:
            CountingBudget.ooms += 1
            raise


class _LSTM(nn.Module):
    """Recurrent: embedding, 2-layer LSTM, vocabulary head (batch 1 takes other kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rnn = nn.Embedding(1000, 128), nn.LSTM(128, 256, 2, batch_first=True)
        self.out = nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.rnn(self.emb(x))[0])
        return out


class _Encoder(nn.Module):
    """Attention from PyTorch's own modules (nn.TransformerEncoder, fused fast paths)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        self.enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(128, 4, 512, batch_first=True), 3)
        self.out = nn.Linear(128, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.enc(self.emb(x)))
        return out


class _VarlenGRU(nn.Module):
    """Variable-length sequences through pack_padded_sequence (lengths differ per sample)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rnn = nn.Embedding(500, 64), nn.GRU(64, 128, batch_first=True)
        self.out = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = (x != 0).sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, h = self.rnn(packed)
        out: torch.Tensor = self.out(h[-1])
        return out


class _Chunked(nn.Module):
    """An op sequence that changes with the batch: batches above 32 run in chunks of 32 (as
    memory-saving code does), smaller ones in one pass."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024),
                                 nn.GELU(), nn.Linear(1024, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= 32:
            out: torch.Tensor = self.net(x)
            return out
        return torch.cat([self.net(c) for c in x.split(32)])


class _ViT(nn.Module):
    """Patches, hand-written attention with dropout, MLP blocks."""

    def __init__(self, dim: int = 192, depth: int = 4, heads: int = 3) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, stride=8)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "n1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim), "proj": nn.Linear(dim, dim),
            "n2": nn.LayerNorm(dim), "mlp": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                                          nn.Dropout(0.1), nn.Linear(4 * dim, dim)),
        }) for _ in range(depth))
        self.heads, self.head = heads, nn.Linear(dim, 10)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        b, n, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["n1"](x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = self.drop((q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1))
            x = x + blk["proj"]((att @ v).transpose(1, 2).reshape(b, n, d))
            x = x + blk["mlp"](blk["n2"](x))
        out: torch.Tensor = self.head(x.mean(1))
        return out


def build(model: str) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """(model, optimizer, make_batch(b) -> (x, y)) with fixed seeds."""
    torch.manual_seed(0)
    tokens = lambda b, v, n: torch.randint(1, v, (b, n))  # noqa: E731
    if model in ("lstm", "transformer"):
        m: nn.Module = _LSTM() if model == "lstm" else _Encoder()

        def make(b: int) -> Any:
            return tokens(b, 1000, 64), tokens(b, 1000, 64)
        return m, torch.optim.Adam(m.parameters()), make
    if model == "conv-bn":
        m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

        def make(b: int) -> Any:
            return torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))
        return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), make
    if model == "varlen-gru":
        m = _VarlenGRU()

        def make(b: int) -> Any:
            # The largest sample (all 128 tokens), as the finder's probes use: shorter ones pad.
            return tokens(b, 500, 128), torch.randint(0, 10, (b,))
        return m, torch.optim.Adam(m.parameters()), make
    if model == "chunked":
        m = _Chunked()

        def make(b: int) -> Any:
            return torch.randn(b, 256), torch.randint(0, 10, (b,))
        return m, torch.optim.Adam(m.parameters()), make
    if model == "vit-dropout":
        m = _ViT()

        def make(b: int) -> Any:
            return torch.randn(b, 3, 64, 64), torch.randint(0, 10, (b,))
        return m, torch.optim.AdamW(m.parameters()), make
    if model == "mlp":
        layers: list[nn.Module] = [nn.Linear(128, 2048)]
        for _ in range(6):
            layers += [nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(2048)]
        layers.append(nn.Linear(2048, 10))
        m = nn.Sequential(*layers)
        opt: torch.optim.Optimizer = torch.optim.Adam(m.parameters())

        def make(b: int) -> Any:
            return torch.randn(b, 128), torch.randint(0, 10, (b,))
    else:
        from redline.workloads.lm import LMConfig, TinyGPT
        cfg = LMConfig()
        m = TinyGPT(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=cfg.lr)

        def make(b: int) -> Any:
            t = torch.randint(0, cfg.vocab, (b, cfg.seq_len + 1))
            return t[:, :-1], t[:, 1:]
    return m, opt, make


def loss_of(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = m(x)
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def state(m: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    ts = list(m.parameters()) + list(m.buffers())
    for st in opt.state.values():
        ts += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return ts


def fits(model: str, b: int) -> bool:
    m, opt, make = build(model)
    try:
        with MemoryBudget(LIMITS[model], existing=state(m, opt)):
            for _ in range(2):
                loss_of(m, *make(b)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        return False
    return True


def run_redline(model: str) -> dict[str, Any]:
    from redline.tune.batch_finder import find_batch_size

    m, opt, make = build(model)

    def step(b: int) -> None:
        loss_of(m, *make(b)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    r = find_batch_size(step, state=lambda: state(m, opt), max_batch=1 << 16,
                        limit_bytes=LIMITS[model])
    return {"batch": r.batch, "trials": r.trials, "ooms": r.ooms}


def run_accelerate(model: str) -> dict[str, Any]:
    from accelerate.utils import find_executable_batch_size

    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=START)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        m, opt, make = build(model)
        with CountingBudget(LIMITS[model], existing=state(m, opt)):
            for _ in range(3):
                loss_of(m, *make(batch_size)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        return batch_size

    b = train()
    return {"batch": b, "trials": len(tried), "ooms": CountingBudget.ooms}


def run_lightning(model: str, mode: str) -> dict[str, Any]:
    import logging
    import warnings

    import lightning as L
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, Dataset

    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    m, _, make = build(model)
    tried: set[int] = set()

    class DS(Dataset[Any]):
        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, i: int) -> Any:
            x, y = make(1)
            return x[0], y[0]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2
            self.net = m

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            tried.add(int(batch[0].shape[0]))
            return loss_of(self.net, *batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters()) if model == "mlp" else \
                torch.optim.AdamW(self.parameters(), lr=3e-4)

        def train_dataloader(self) -> Any:
            return DataLoader(DS(), batch_size=self.batch_size)

    lm = Module()
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir="/tmp/redline-bench-pl")
    with CountingBudget(LIMITS[model], existing=list(lm.parameters())):
        b = Tuner(trainer).scale_batch_size(lm, mode=mode, init_val=2, max_trials=25)
    return {"batch": b, "trials": len(tried), "ooms": CountingBudget.ooms}


def run_hf(model: str) -> dict[str, Any]:
    """Hugging Face Trainer(auto_find_batch_size=True): Accelerate's search around the
    Trainer's inner loop, from per_device_train_batch_size=START down."""
    import logging
    import tempfile
    import warnings

    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    m, _, make = build(model)
    tried: set[int] = set()

    class DS(Dataset[Any]):
        def __len__(self) -> int:
            return 1 << 20

        def __getitem__(self, i: int) -> Any:
            x, y = make(1)
            return {"x": x[0], "y": y[0]}

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = m

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            tried.add(int(x.shape[0]))
            return {"loss": loss_of(self.net, x, y)}

    wm = Wrapped()
    # AdamW keeps the state Adam does (two moments per parameter): the same memory as the
    # other tools' optimizers.
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="redline-bench-hf-"),
                             per_device_train_batch_size=START, auto_find_batch_size=True,
                             max_steps=3, report_to=[], save_strategy="no", use_cpu=True,
                             disable_tqdm=True, optim="adamw_torch", dataloader_num_workers=0)
    trainer = Trainer(model=wm, args=args, train_dataset=DS())
    with CountingBudget(LIMITS[model], existing=list(wm.parameters())):
        trainer.train()
    return {"batch": trainer.state.train_batch_size, "trials": len(tried),
            "ooms": CountingBudget.ooms}


def child(tool: str, model: str) -> None:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if tool == "redline":
        out = run_redline(model)
    elif tool == "accelerate":
        out = run_accelerate(model)
    elif tool == "hf":
        out = run_hf(model)
    else:
        out = run_lightning(model, tool.split("-")[1])
    out["wall_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out))


def spawn(*args: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                       env=env, timeout=1800)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": (r.stderr or r.stdout)[-400:]}
    return dict(json.loads(line[7:]))


def true_max(model: str) -> tuple[int, int, float]:
    """Bisection over fresh processes: (max, launches, seconds)."""
    t0 = time.perf_counter()
    lo, hi, n = 1, 1 << 15, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        n += 1
        r = spawn("--fits", model, str(mid))
        if "fits" not in r:
            raise RuntimeError(f"fits({model}, {mid}) failed: {r.get('error')}")
        ok = r["fits"]
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo, n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "MODEL"))
    ap.add_argument("--fits", nargs=2, metavar=("MODEL", "B"))
    ap.add_argument("--models", default=",".join(LIMITS))
    ap.add_argument("--tools",
                    default="redline,lightning-power,lightning-binsearch,accelerate,hf")
    a = ap.parse_args()
    if a.fits:
        torch.set_num_threads(1)
        print("RESULT " + json.dumps({"fits": fits(a.fits[0], int(a.fits[1]))}))
        return
    if a.child:
        child(*a.child)
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread per process; budgets "
          + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in LIMITS.items()))
    print("| model | tool | batch | % of true max | trials | OOMs | wall s |")
    print("|---|---|---|---|---|---|---|")
    for model in a.models.split(","):
        tmax, n, secs = true_max(model)
        print(f"| {model} | oracle: fresh-process bisection | {tmax} | 100 | {n} | — | "
              f"{secs:.1f} |", flush=True)
        for tool in a.tools.split(","):
            r = spawn("--child", tool, model)
            if "error" in r:
                print(f"| {model} | {tool} | error: {r['error']!r} | | | | |", flush=True)
                continue
            print(f"| {model} | {tool} | {r['batch']} | {100 * r['batch'] / tmax:.1f} | "
                  f"{r['trials']} | {r['ooms']} | {r['wall_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
