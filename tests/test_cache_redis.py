"""The distributed store on real redis-server processes (loopback): partitioning, pipelined
batch reads, a server that goes away mid-epoch, a full server.

CI installs Debian's redis-server (.ci/run); elsewhere these tests skip when it is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import CachedDataset, RedisStore

REDIS = shutil.which("redis-server")
if REDIS is None and os.environ.get("CI"):
    raise RuntimeError("CI must install redis-server (see .ci/run)")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed "
                                "(apt-get install redis-server); CI installs it")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, maxmemory: str = "64mb") -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [str(REDIS), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", maxmemory,
             "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        self.client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                if self.client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    ss = [Server(), Server()]
    yield ss
    for s in ss:
        s.stop()


class Numbers(Dataset[int]):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> int:
        return i


def det(i: int) -> torch.Tensor:
    return torch.full((32,), float(i))


def test_partitioned_and_pipelined(servers: list[Server]) -> None:
    store = RedisStore([s.url for s in servers])
    ds = CachedDataset(Numbers(), det, store=store)
    loader = DataLoader(ds, batch_size=20, num_workers=2, shuffle=True)
    for _ in range(2):
        for b in loader:
            assert b.shape == (20, 32)
    sizes = [s.client.dbsize() for s in servers]
    assert sum(sizes) == 200 and min(sizes) > 40  # both servers hold a share
    st = ds.stats()
    assert (st.hits, st.misses) == (200, 200)
    got = ds.__getitems__(list(range(0, 200, 7)))  # one MGET per server
    assert all(float(g[0]) == i for g, i in zip(got, range(0, 200, 7), strict=True))


def test_server_gone_mid_epoch_recomputes_and_says_so_once(servers: list[Server]) -> None:
    ds = CachedDataset(Numbers(), det, store=RedisStore([s.url for s in servers],
                                                        timeout_s=0.5))
    for i in range(200):
        ds[i]
    servers[1].stop()
    with pytest.warns(RuntimeWarning, match="unreachable") as rec:
        values = [ds[i] for i in range(200)]
    assert len(rec) == 1
    assert all(float(v[0]) == i for i, v in enumerate(values))
    st = ds.stats()
    assert 0 < st.misses - 200 < 200  # the lost server's share was recomputed


def test_full_server_passes_through() -> None:
    small = Server(maxmemory="1mb")
    try:
        ds = CachedDataset(Numbers(), lambda i: torch.zeros(20_000) + i,
                           store=RedisStore([small.url]))
        with pytest.warns(RuntimeWarning, match="full"):
            values = [ds[i] for i in range(200)]
        assert all(float(v[0]) == i for i, v in enumerate(values))
        assert ds.stats().uncached > 0
    finally:
        small.stop()


def test_consistent_hashing_moves_few_keys() -> None:
    urls = [f"redis://127.0.0.1:{7000 + n}" for n in range(4)]
    keys = [f"k{i}".encode() for i in range(4000)]
    four = RedisStore(urls)
    three = RedisStore(urls[:3])
    moved = sum(1 for k in keys if four.node(k) != 3 and four.node(k) != three.node(k))
    assert moved == 0  # keys not on the removed server stay where they were
    share = sum(1 for k in keys if four.node(k) == 3) / len(keys)
    assert 0.1 < share < 0.4  # about a quarter each
    with pytest.raises(ValueError, match="at least one server"):
        RedisStore([])
