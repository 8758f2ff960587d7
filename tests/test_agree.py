"""Ranks agree through a real c10d TCPStore (the one torchrun's agent serves): every rank gets
every rank's value in rank order, a failure on one rank raises on all, and a rank that never
arrives or runs other code is named instead of waited for forever."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from torch._C._distributed_c10d import TCPStore

from redline.measure.agree import Agreement, RankFailedError, RanksDivergedError
from redline.measure.ranks import JobStore, RankInfo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def store_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    port = _free_port()
    master = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                      wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield master


def _ranks(world: int, body: Callable[[Agreement], Any], timeout_s: float = 10.0,
           ) -> list[Any]:
    """Run ``body`` as each of ``world`` ranks (threads, each with its own store client)."""
    out: list[Any] = [None] * world
    agreements = []
    for r in range(world):
        info = RankInfo(rank=r, world_size=world, local_rank=r, local_world_size=world, host=f"h{r // 2}",
                        run_id="test.0")
        a = Agreement(info, JobStore(info), timeout_s=timeout_s)
        a.name = "t"  # the n-th agreement of every rank is one: here, one per test
        agreements.append(a)

    def run(r: int) -> None:
        try:
            out[r] = body(agreements[r])
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_every_rank_reads_every_value_in_rank_order(store_env: Any) -> None:
    got = _ranks(3, lambda a: (a.gather(a.rank * 10, "x"), a.max(float(a.rank), "m"),
                               a.min(float(a.rank), "n"), a.all(a.rank != 1, "ok"),
                               a.first(f"r{a.rank}", "f"), a.points))
    assert got == [([0, 10, 20], 2.0, 0.0, False, "r0", 5)] * 3


def test_a_failure_on_one_rank_raises_on_every_rank(store_env: Any) -> None:
    def body(a: Agreement) -> Any:
        def trial() -> int:
            if a.rank == 1:
                raise ValueError("no memory for batch 64")
            return a.rank
        return a.run(trial, "trial b64")

    got = _ranks(2, body)
    assert all(isinstance(e, ValueError) and "no memory for batch 64" in str(e) for e in got)
    assert any("raised on rank 1 at 'trial b64'" in n for n in getattr(got[0], "__notes__", []))
    assert not getattr(got[1], "__notes__", None)  # rank 1 raises its own, untouched


def test_an_error_that_does_not_pickle_still_arrives_by_name(store_env: Any) -> None:
    class Local(Exception):  # defined in a function: pickle cannot find it by name
        pass

    def body(a: Agreement) -> Any:
        def trial() -> int:
            if a.rank == 0:
                raise Local("compiler missing")
            return 1
        return a.run(trial, "compile")

    got = _ranks(2, body)
    assert isinstance(got[1], RankFailedError)
    assert "rank 0 failed: Local: compiler missing" in str(got[1])


def test_a_rank_that_never_arrives_is_named_after_the_timeout(store_env: Any) -> None:
    got = _ranks(2, lambda a: a.gather(1, "late") if a.rank == 0 else None, timeout_s=0.5)
    assert isinstance(got[0], RanksDivergedError)
    assert "for rank(s) [1], which never arrived" in str(got[0])


def test_ranks_at_different_points_are_told_they_diverged(store_env: Any) -> None:
    got = _ranks(2, lambda a: a.gather(1, f"point of rank {a.rank}"))
    assert all(isinstance(e, RanksDivergedError) for e in got)
    assert "took different paths: rank 0 is at 'point of rank 0', rank 1 at 'point of rank " \
           "1'" in str(got[0])


def test_one_process_agrees_with_itself_without_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    a = Agreement.for_job()
    assert a.store is None and a.world_size == 1
    assert a.gather(3, "x") == [3] and a.run(lambda: 4, "y") == [4]
    with pytest.raises(KeyError):
        a.run(lambda: {}["k"], "z")
