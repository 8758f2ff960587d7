"""CachedDataset: the epoch that fills the store, an uncached epoch and a cached one, side by
side in one run, read sample by sample and through a DataLoader with 2 workers, for samples of
about 10 kB, 150 kB and 1 MB; then cached reads against a raw read of the same bytes from the
page cache, and the Redis store against the LMDB one.

The pipeline is the one users met: PNG files on disk (written here, in a temporary folder),
decoded, resized and standardized to a float32 CHW tensor, all of it deterministic, so what is
cached is the float tensor (3×32×26 = 10 kB, 3×96×128 = 147 kB, 3×256×341 = 1.05 MB; the 147 kB
case is 512 images of 96×128 read one by one, as in the report that the fill cost 1.51×). PIL
decodes where it is installed; without it each "PNG" is the same pixels zlib-compressed and
decoded by zlib + numpy (a substitute, said in the output).

After one untimed uncached epoch (the decoder's and the allocator's warm-up), each round
makes a fresh store in /dev/shm (the default store's place), and runs, order alternating
between rounds, a fill epoch and an uncached epoch, then a cached epoch; epochs
are in a fresh random order, a DataLoader epoch is timed from ``iter`` to its workers' exit.
The ratio is the median over rounds of each round's fill / uncached (paired: a slow moment of
a shared host moves both), printed with a distribution-free interval for it (two order
statistics of the rounds); a row is met where that whole interval is within the target, and
"met at the median" where only the median is.

Run: .venv/bin/python benchmarks/cache.py [--rounds 25] [--sizes 10k,150k,1m] [--no-extras]
[--patterns sample,loader] [--compare-writers] [--compare-placement]
[--compare-batch-bytes] [--compare-lookups] [--compare-fill-path] [--compare-hand-over]
[--compare-settle] [--torch-threads N]
Targets: fill ≤ 1.10× the uncached epoch on each row; cached epoch ≥ 5× faster than uncached
where the decode is the cost; cached reads ≥ 50 % of raw page-cache read throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import CachedDataset, cache_ring

try:
    from PIL import Image
except ImportError:  # the zlib + numpy substitute below
    Image = None  # type: ignore[assignment]

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

SIZES: dict[str, tuple[int, int, int]] = {
    "10k": (32, 26, 1024),  # output height, width, samples
    "150k": (96, 128, 512),
    "1m": (256, 341, 256),
}


def write_images(folder: Path, n: int, h: int, w: int) -> list[str]:
    """``n`` images of 2h×2w (natural-looking: smooth gradients and noise, so PNG compresses
    them as it would a photo, not a flat field) as PNG files (or the substitute)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:2 * h, 0:2 * w]
    paths = []
    for i in range(n):
        base = (yy * (i % 7 + 1) + xx * (i % 5 + 1)) % 256
        img = np.stack([base, (base + 85) % 256, (base + 170) % 256], axis=-1)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        p = folder / f"{i}.png"
        if Image is not None:
            Image.fromarray(img).save(p)
        else:
            p.write_bytes(np.array(img.shape, np.int32).tobytes() + zlib.compress(img.tobytes()))
        paths.append(str(p))
    return paths


class Decode:
    """PNG path → decoded, resized (bilinear) and standardized float32 CHW tensor."""

    def __init__(self, h: int, w: int) -> None:
        self.h, self.w = h, w

    def __call__(self, path: str) -> torch.Tensor:
        if Image is not None:
            with Image.open(path) as im:
                arr = np.asarray(im.convert("RGB").resize((self.w, self.h),
                                                          Image.Resampling.BILINEAR))
        else:
            blob = Path(path).read_bytes()
            shape = tuple(np.frombuffer(blob[:12], np.int32))
            full = np.frombuffer(zlib.decompress(blob[12:]), np.uint8).reshape(shape)
            arr = full[::2, ::2][:self.h, :self.w]  # nearest neighbour: the substitute's resize
        t = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255)
        return (t - MEAN) / STD


class Files(Dataset[str]):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.fingerprint = f"bench-{len(paths)}-{paths[0]}"

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> str:
        return self.paths[i]


class Uncached(Dataset[torch.Tensor]):
    def __init__(self, src: Files, f: Callable[[str], torch.Tensor]) -> None:
        self.src, self.f = src, f

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.f(self.src[i])


def epoch_s(ds: Any, pattern: str) -> float:
    n = len(ds)
    t = time.perf_counter()
    if pattern == "sample":
        for i in random.sample(range(n), n):
            ds[i]
    else:
        it = iter(DataLoader(ds, batch_size=32, shuffle=True, num_workers=2))
        for _ in it:
            pass
        del it  # the workers exit (and write what they still hold) inside the timed span
    return time.perf_counter() - t


def release(ds: CachedDataset) -> None:
    """End a round's writer and close its store in this process. A user's process has a store
    or two; a run of this benchmark makes dozens, and a store removed while a process still
    maps it stays in memory (tmpfs keeps an unlinked file while it is mapped): later rounds
    would run beside gigabytes of dead stores, which slows their fills (the README's cache
    section)."""
    writer = ds._tally.writer
    if writer is not None:
        writer.close()
    close = getattr(ds.store, "close", None)
    if close is not None:
        close()


def measure(paths: list[str], h: int, w: int, pattern: str, rounds: int,
            shm: Path) -> dict[str, list[float]]:
    src, f = Files(paths), Decode(h, w)
    out: dict[str, list[float]] = {"fill": [], "uncached": [], "cached": [], "ratio": []}
    # An untimed uncached epoch first: whichever epoch ran first would otherwise pay the
    # decoder's and the allocator's warm-up (and, through a DataLoader, the first fork).
    epoch_s(Uncached(src, f), pattern)
    for r in range(rounds):
        store = Path(tempfile.mkdtemp(prefix="redline-bench-", dir=shm))
        try:
            ds = CachedDataset(src, f, store=store, max_bytes=2**31)
            got: dict[str, float] = {}
            for k in (["fill", "uncached"] if r % 2 == 0 else ["uncached", "fill"]):
                got[k] = epoch_s(ds if k == "fill" else Uncached(src, f), pattern)
            ds.flush()
            st = ds.stats()
            assert st.complete and st.misses == len(src), st
            got["cached"] = epoch_s(ds, pattern)
            release(ds)
            for k, v in got.items():
                out[k].append(v)
            out["ratio"].append(got["fill"] / got["uncached"])
        finally:
            shutil.rmtree(store, ignore_errors=True)
    return out


LEVEL = 0.95
"""The confidence each row's interval is asked to reach."""


def median_interval(xs: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage): the sorted rounds' k-th smallest and k-th largest, with the
    largest k whose chance of holding the median between them is at least ``level``, that
    chance being 1 - 2·P(Binomial(n, ½) < k), whatever the rounds' distribution (Conover,
    Practical Nonparametric Statistics, 3rd ed., §3.2); the outermost two and their coverage
    where too few rounds reach ``level``."""
    s, n = sorted(xs), len(xs)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return s[k - 1], s[n - k], coverage(k)


def verdict(ratio: float, high: float, coverage: float, target: float = 1.10) -> str:
    if ratio > target:
        return "NOT MET"
    if high > target:
        return f"met at the median; its {coverage:.0%} interval reaches {high:.3f}"
    if coverage < LEVEL:  # too few rounds for the interval to say much
        return f"met (an interval of {coverage:.0%} only: more rounds)"
    return "met"


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited (DataLoader workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _nonvoluntary_switches() -> int:
    """How often the kernel has taken this thread off its CPU for another (proc(5))."""
    path = f"/proc/self/task/{threading.get_native_id()}/status"
    for line in Path(path).read_text().splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def compare(paths: list[str], h: int, w: int, rounds: int, shm: Path, what: str,
            variants: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]],
            pattern: str = "sample") -> None:
    """A fill under each of ``variants`` (a context that sets it up), in alternating rounds:
    fill ÷ uncached; read one by one, how often the training thread was taken off its CPU
    during the fill (by the writer, where it shares that CPU); through DataLoader workers, the
    workers' CPU time per sample against the uncached epoch's (the epoch is CPU-bound there,
    and CPU time is steadier than the wall clock on a shared host)."""
    src, f = Files(paths), Decode(h, w)
    ratios: dict[str, list[float]] = {k: [] for k in variants}
    switches: dict[str, list[int]] = {k: [] for k in variants}
    cpu_us: dict[str, list[float]] = {k: [] for k in variants}
    epoch_s(Uncached(src, f), pattern)
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            store = Path(tempfile.mkdtemp(prefix="redline-bench-", dir=shm))
            try:
                with variants[name]():
                    ds = CachedDataset(src, f, store=store, max_bytes=2**31)
                    s0, c0 = _nonvoluntary_switches(), _children_cpu_s()
                    fill = epoch_s(ds, pattern)
                    switches[name].append(_nonvoluntary_switches() - s0)
                    c1 = _children_cpu_s()
                    unc = epoch_s(Uncached(src, f), pattern)
                    # the workers of both epochs have exited: their CPU is counted
                    cpu_us[name].append(((c1 - c0) - (_children_cpu_s() - c1)) / len(src) * 1e6)
                    ds.flush()
                    assert ds.stats().complete
                    ratios[name].append(fill / unc)
                    release(ds)  # this variant's writer ends within its context
            finally:
                shutil.rmtree(store, ignore_errors=True)
    if pattern == "sample":
        label, extra = "one by one", "the training thread's involuntary switches in the fill"
    else:
        label, extra = "DataLoader, 2 workers", "the workers' extra CPU µs a sample in the fill"
    print(f"{3 * h * w * 4 / 1e3:>6.0f}kB {label}, {what}, fill ÷ uncached (median of "
          f"{rounds} alternating rounds; {extra}):")
    for name in variants:
        side = (f"switches {statistics.median(switches[name]):>5.0f}" if pattern == "sample"
                else f"CPU +{statistics.median(cpu_us[name]):>6.1f} µs")
        print(f"    {name:<40} {statistics.median(ratios[name]):.3f}×  {side}  (rounds: "
              f"{', '.join(f'{x:.3f}' for x in ratios[name])})")


def compare_writers(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """The training process's two writers: the writer process (the default,
    :mod:`redline.data.cache_proc`) and the writer thread (where that process cannot run,
    :class:`~redline.data.cache_writer.StoreWriter`)."""
    from redline.data import cache as cache_module
    from redline.data.cache_writer import StoreWriter

    compare(paths, h, w, rounds, shm, "the training process's writers", {
        "writer process": contextlib.nullcontext,
        "writer thread": lambda: mock.patch.object(cache_module, "_new_writer", StoreWriter)})


def compare_placement(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """The writer process kept off the training thread's CPU (the default,
    :class:`redline.data.cache_child._KeepOff`) against placed by the kernel alone."""
    from redline.data import cache_child

    compare(paths, h, w, rounds, shm, "where the writer process runs", {
        "kept off the training thread's CPU": contextlib.nullcontext,
        "placed by the kernel": lambda: mock.patch.object(cache_child, "PLACE_CHECK_S", float("inf"))})


def compare_batch_bytes(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """Through DataLoader workers: transactions of at most 256 KiB (the default,
    :data:`redline.data.lmdb_env.BATCH_BYTES`) against at most 8 MiB."""
    from redline.data import cache_writer

    compare(paths, h, w, rounds, shm, "bytes a transaction holds", {
        "256 KiB": contextlib.nullcontext,
        "8 MiB": lambda: mock.patch.object(cache_writer, "BATCH_BYTES", 8 * 2**20)}, "loader")


def compare_lookups(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """Read one by one: a sample never handed to the writer process taken as not stored,
    without a lookup, while nobody else writes to the store (the default,
    :meth:`redline.data.cache_proc.ProcessWriter.only_own`) against every sample looked up."""
    from redline.data import cache_proc

    def never(self: Any, last_txn: int) -> None:
        return None

    compare(paths, h, w, rounds, shm, "the store's lookups of a fill", {
        "skipped for samples never handed over": contextlib.nullcontext,
        "every sample looked up": lambda: mock.patch.object(cache_proc.ProcessWriter, "expect_only_own",
                                                   never)})


def compare_fill_path(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """Read one by one: a fill's miss through the short path that checks once what stays
    true while the writer process fills the store alone (the default,
    ``CachedDataset._fill``) against the general miss path, which checks it each sample."""
    def never(self: Any, *args: Any) -> None:
        return None

    compare(paths, h, w, rounds, shm, "a fill's miss path", {
        "short path": contextlib.nullcontext,
        "general path": lambda: mock.patch.object(CachedDataset, "_start_fill", never)})


def compare_hand_over(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """Read one by one: a fill's per-sample hand-over of a tensor in C (the default where it
    was built at install, :data:`redline.data.cache_ring.COMPILED`) against the same in
    Python (:class:`redline.data.cache_ring.PyRing`, what an install without a C compiler
    runs)."""
    from redline.data import cache_ring

    if not cache_ring.COMPILED:
        print("--compare-hand-over: redline.data._ring is not built here (no C compiler at "
              "install): only the Python hand-over runs")
        return
    compare(paths, h, w, rounds, shm, "the per-sample hand-over", {
        "compiled (redline.data._ring)": contextlib.nullcontext,
        "Python (cache_ring.PyRing)": lambda: mock.patch.object(cache_ring, "COMPILED", False)})


def compare_settle(paths: list[str], h: int, w: int, rounds: int, shm: Path) -> None:
    """Read one by one: a batch's records entered in ``pending`` only where it is read or the
    writer process wrote part of the batch (the default,
    :meth:`redline.data.cache_proc.ProcessWriter._release`) against entered at each publish."""
    from redline.data import cache_proc

    send = cache_proc.ProcessWriter._send

    def eager(self: Any, end: int) -> None:
        send(self, end)
        self._settle()

    compare(paths, h, w, rounds, shm, "when a batch's records enter pending", {
        "where needed": contextlib.nullcontext,
        "at each publish": lambda: mock.patch.object(cache_proc.ProcessWriter, "_send", eager)})


def read_throughput(paths: list[str], h: int, w: int, shm: Path) -> None:
    """Cached reads by index (decoded to tensors) against a raw sequential read of the store's
    file from the page cache."""
    store = Path(tempfile.mkdtemp(prefix="redline-bench-", dir=shm))
    try:
        ds = CachedDataset(Files(paths), Decode(h, w), store=store, max_bytes=2**31)
        for i in range(len(ds)):
            ds.get_deterministic(i)
        ds.flush()
        best_c = best_r = 0.0
        for _ in range(3):
            st0 = ds.stats()
            t = time.perf_counter()
            for i in range(len(ds)):
                ds.get_deterministic(i)
            best_c = max(best_c, (ds.stats().bytes_read - st0.bytes_read)
                         / (time.perf_counter() - t))
        for _ in range(6):  # the first pass also warms the page cache
            t = time.perf_counter()
            raw = 0
            with open(store / "data.mdb", "rb") as fh:
                while chunk := fh.read(2**20):
                    raw += len(chunk)
            best_r = max(best_r, raw / (time.perf_counter() - t))
        print(f"cached reads {best_c / 1e6:,.0f} MB/s (by index, decoded to tensors) vs raw "
              f"sequential page-cache read {best_r / 1e6:,.0f} MB/s → {best_c / best_r:.0%} "
              "(target ≥ 50 %)")
    finally:
        shutil.rmtree(store, ignore_errors=True)


def redis_vs_local(paths: list[str], h: int, w: int, shm: Path) -> None:
    import socket

    exe = shutil.which("redis-server")
    if exe is None:
        print("Redis store: redis-server not installed, not measured")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    store = Path(tempfile.mkdtemp(prefix="redline-bench-", dir=shm))
    try:
        import redis

        from redline.data import RedisStore

        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        src, f = Files(paths), Decode(h, w)
        rates = {}
        for name, st in (("LMDB", store),
                         ("Redis", RedisStore([f"redis://127.0.0.1:{port}/0"]))):
            ds = CachedDataset(src, f, store=st, max_bytes=2**31)
            epoch_s(ds, "sample")
            ds.flush()
            rates[name] = len(src) / min(epoch_s(ds, "sample") for _ in range(3))
        print(f"Redis store (loopback): cached epoch {rates['Redis']:,.0f} samples/s one by one "
              f"vs LMDB {rates['LMDB']:,.0f} → {rates['Redis'] / rates['LMDB']:.0%} of local")
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    # 25, not fewer: a DataLoader epoch's rounds spread ~0.8-1.3x on a shared 2-core host, and
    # 9 rounds leave intervals that cross the target where the medians sit well inside it
    ap.add_argument("--rounds", type=int, default=25,
                    help="paired rounds a row (25: the median's interval covers 96 %%)")
    ap.add_argument("--sizes", default="10k,150k,1m")
    ap.add_argument("--patterns", default="sample,loader")
    ap.add_argument("--no-extras", action="store_true",
                    help="skip the raw-read and Redis comparisons")
    ap.add_argument("--compare-writers", action="store_true",
                    help="also time the writer process against the writer thread, one by one")
    ap.add_argument("--compare-placement", action="store_true",
                    help="also time the writer process kept off the training thread's CPU "
                    "against placed by the kernel, one by one")
    ap.add_argument("--compare-batch-bytes", action="store_true",
                    help="also time DataLoader workers writing transactions of 256 KiB "
                    "against 8 MiB")
    ap.add_argument("--compare-lookups", action="store_true",
                    help="also time a fill one by one that skips the lookups of samples never "
                    "handed to the writer against one that looks every sample up")
    ap.add_argument("--compare-fill-path", action="store_true",
                    help="also time a fill one by one through the miss's short path against "
                    "its general path")
    ap.add_argument("--compare-hand-over", action="store_true",
                    help="also time a fill one by one with the per-sample hand-over in C "
                    "against the same in Python")
    ap.add_argument("--compare-settle", action="store_true",
                    help="also time a fill one by one that enters a batch's records in pending "
                    "only where needed against at each publish")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch.set_num_threads for the decode (default: torch's own)")
    args = ap.parse_args()
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    load = os.getloadavg()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, torch {torch.__version__}, decode: "
          f"{'PIL PNG' if Image is not None else 'zlib + numpy substitute (no PIL)'}, "
          f"{torch.get_num_threads()} torch threads, "
          f"store in {shm}, median of {args.rounds} rounds, hand-over "
          f"{'in C' if cache_ring.COMPILED else 'in Python (redline.data._ring not built)'}")
    print(f"{'sample':>8} {'n':>5} {'pattern':>22} {'fill s':>8} {'uncached s':>10} "
          f"{'cached s':>9} {'fill/uncached':>13} {'interval':>13} {'cached ×':>8}  "
          f"target ≤ 1.10")
    folder = Path(tempfile.mkdtemp(prefix="redline-bench-png-"))
    worst = 0.0
    try:
        made: dict[str, list[str]] = {}
        for size in args.sizes.split(","):
            h, w, n = SIZES[size]
            sub = folder / size
            sub.mkdir()
            made[size] = paths = write_images(sub, n, h, w)
            kb = 3 * h * w * 4 / 1e3
            for pattern in args.patterns.split(","):
                m = measure(paths, h, w, pattern, args.rounds, shm)
                fill, unc, cached = (statistics.median(m[k])
                                     for k in ("fill", "uncached", "cached"))
                ratio = statistics.median(m["ratio"])
                low, high, coverage = median_interval(m["ratio"])
                worst = max(worst, ratio)
                label = "one by one" if pattern == "sample" else "DataLoader, 2 workers"
                print(f"{kb:>6.0f}kB {n:>5} {label:>22} {fill:>8.3f} {unc:>10.3f} "
                      f"{cached:>9.3f} {ratio:>12.3f}× {low:>6.3f}–{high:.3f} "
                      f"{unc / cached:>7.1f}×  {verdict(ratio, high, coverage)} (rounds: "
                      f"{', '.join(f'{x:.3f}' for x in m['ratio'])})")
        print(f"worst fill/uncached {worst:.3f}× (target ≤ 1.10×); load at the end "
              f"{os.getloadavg()[0]:.2f}")
        for wanted, comparison in ((args.compare_writers, compare_writers),
                                   (args.compare_batch_bytes, compare_batch_bytes),
                                   (args.compare_lookups, compare_lookups),
                                   (args.compare_fill_path, compare_fill_path),
                                   (args.compare_hand_over, compare_hand_over),
                                   (args.compare_settle, compare_settle),
                                   (args.compare_placement, compare_placement)):
            for size, paths in made.items() if wanted else ():
                h, w, _ = SIZES[size]
                comparison(paths, h, w, args.rounds, shm)
        if not args.no_extras and "150k" in made:
            h, w, _ = SIZES["150k"]
            read_throughput(made["150k"], h, w, shm)
            redis_vs_local(made["150k"], h, w, shm)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
