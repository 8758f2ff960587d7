"""The merged report of a multi-process job, from controlled per-rank summaries: the per-rank
table, the merged view, arrival skew at collectives, and the straggler with its cause."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from redline.core.findings import Finding
from redline.core.report import RankEntry, RanksReport
from redline.runs.ranks import decode, encode, merge

STEP = 0.040


def _summary(rank: int, *, late_s: float = 0.0, data_s: float = 0.002, fwd_s: float = 0.005,
             bwd_s: float = 0.030, cpu: float = 0.9, host: str = "node0", steps: int = 10,
             jitter_ns: int = 0, findings: list[dict[str, Any]] | None = None,
             reason: str | None = None, compute: list[float] | None = None,
             run_delay_s: float | None = None) -> dict[str, Any]:
    """Rank ``rank``: ``steps`` steps of one all-reduce each, arriving ``late_s`` after t0."""
    t0 = 1_000_000_000_000
    arrivals = [["0", k, t0 + int((k * STEP + late_s) * 1e9) + (jitter_ns * ((k + rank) % 2))]
                for k in range(steps)]
    return {"rank": rank, "local_rank": rank % 8, "host": host, "status": "completed",
            "steps_measured": steps, "last_step": steps + 2, "step_time_mean_s": STEP,
            "phases": {"data_wait": data_s, "h2d_copy": 0.0, "forward": fwd_s,
                       "backward": bwd_s, "optimizer": 0.001, "other": 0.002},
            "throughput_samples_per_s": 800.0, "main_cpu_cores": cpu, "run_delay_s": run_delay_s,
            "arrivals": [] if reason else arrivals, "arrivals_reason": reason,
            "findings": findings or [],
            # each step ends just after its all-reduce
            "step_ends_ns": [t + 1_000_000 for _, _, t in arrivals],
            "step_compute_s": compute or [fwd_s + bwd_s + 0.001] * steps}


def _merge(summaries: list[dict[str, Any]], world: int | None = None,
           own: list[Finding] | None = None) -> Any:
    s0, *rest = summaries
    return merge(s0, {s["rank"]: decode(encode(s)) for s in rest}, world or len(summaries),
                 own or [])


def _straggler(findings: list[Finding]) -> Finding | None:
    return next((f for f in findings if f.id == "straggler"), None)


def test_a_rank_slow_to_load_data_is_the_straggler_and_data_is_why() -> None:
    # rank 1 arrives 25 ms late at every all-reduce; it waited 25 ms more for data; rank 0
    # waited those 25 ms at the collective, inside its backward
    ranks, findings = _merge([_summary(0, bwd_s=0.055), _summary(1, late_s=0.025,
                                                                data_s=0.027)])
    e0, e1 = ranks.ranks
    assert (e0.last_arrivals, e1.last_arrivals) == (0, 10)
    assert e0.comm_wait_s == pytest.approx(0.025) and e1.comm_wait_s == pytest.approx(0.0)
    assert e1.lateness_s == pytest.approx(0.025)
    f = _straggler(findings)
    assert f is not None and f.rank == 1
    assert "waits 25.0 ms more per step for data" in f.title
    assert f.evidence["others_wait_ms_per_step"] == pytest.approx(25.0)
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.025 / STEP))
    assert ranks.merged["data_wait_s"].slowest_rank == 1


def test_a_rank_slow_to_compute_is_the_straggler_although_step_times_are_equal() -> None:
    ranks, findings = _merge([_summary(0, bwd_s=0.055), _summary(1, late_s=0.025,
                                                                bwd_s=0.055)])
    assert ranks.merged["step_time_mean_s"].spread == 0.0  # DDP equalizes step times
    f = _straggler(findings)
    assert f is not None and f.rank == 1 and "computes 25.0 ms more per step" in f.title


def test_cpu_contention_is_named_when_the_slow_rank_gets_less_cpu() -> None:
    _, findings = _merge([_summary(0, bwd_s=0.055, cpu=0.95),
                          _summary(1, late_s=0.025, bwd_s=0.055, cpu=0.4)])
    f = _straggler(findings)
    assert f is not None and "CPU contention on its host" in f.title


def test_cpu_contention_is_named_when_the_slow_rank_waits_for_a_cpu() -> None:
    # both processes get the same CPU per second, but rank 1's training thread was runnable
    # without a CPU 20 ms a step (another process on its core)
    _, findings = _merge([_summary(0, bwd_s=0.055, run_delay_s=0.001),
                          _summary(1, late_s=0.025, bwd_s=0.055, run_delay_s=0.021)])
    f = _straggler(findings)
    assert f is not None and "CPU contention on its host" in f.title
    assert "waits 20.0 ms more per step than the others' for a CPU" in f.title
    assert f.evidence["run_delay_excess_ms"] == pytest.approx(20.0)
    # a run delay well below its extra compute is not why: its compute is
    _, findings = _merge([_summary(0, bwd_s=0.055, run_delay_s=0.001),
                          _summary(1, late_s=0.025, bwd_s=0.055, run_delay_s=0.005)])
    f = _straggler(findings)
    assert f is not None and "CPU contention" not in f.title
    assert f.evidence["run_delay_excess_ms"] == pytest.approx(4.0)


def test_balanced_ranks_have_no_straggler() -> None:
    # arrivals alternate within 0.2 ms: someone is always last, nobody for a reason
    _, findings = _merge([_summary(r, jitter_ns=200_000) for r in range(4)])
    assert _straggler(findings) is None
    # one rank always last, but by 0.3 ms a step: scheduler noise, not a straggler
    _, findings = _merge([_summary(0), _summary(1, late_s=0.0003)])
    assert _straggler(findings) is None


def test_eight_ranks_merge_with_a_missing_rank_named() -> None:
    s = [_summary(r, late_s=0.02 if r == 5 else 0.0, data_s=0.022 if r == 5 else 0.002)
         for r in range(8) if r != 3]
    ranks, findings = _merge(s, world=8)
    assert ranks.missing == [3] and [e.rank for e in ranks.ranks] == list(range(8))
    assert ranks.ranks[3].status == "missing" and ranks.ranks[3].host == "unknown"
    f = _straggler(findings)
    assert f is not None and f.rank == 5


def test_findings_of_one_rank_carry_its_rank_and_shared_ones_none() -> None:
    starving = {"id": "data_starvation", "severity": "high", "title": "t", "evidence": {},
                "ceiling_speedup": 2.0, "fix": "f", "rank": None}
    syncs = {**starving, "id": "host_sync", "ceiling_speedup": None}
    own = [Finding(**{**syncs, "rank": None})]
    _, findings = _merge([_summary(0), _summary(1, findings=[starving, syncs])], own=own)
    by_id = {f.id: f for f in findings}
    assert by_id["data_starvation"].rank == 1
    assert by_id["host_sync"].rank is None  # every rank has it


def test_arrivals_across_hosts_or_unread_are_not_compared() -> None:
    ranks, findings = _merge([_summary(0), _summary(1, host="node1", late_s=0.02)])
    assert "2 hosts" in ranks.arrivals_source and ranks.ranks[0].comm_wait_s is None
    assert _straggler(findings) is None
    ranks, _ = _merge([_summary(0, reason="no flight recorder"), _summary(1)])
    assert ranks.arrivals_source.startswith("arrivals unknown: no flight recorder")


def test_arrivals_across_hosts_are_compared_on_rank_0s_clock() -> None:
    """Rank 1's host clock runs 5 s behind rank 0's: its raw enqueue times look 5 s early.
    Aligned by the measured offset, rank 1 is 25 ms late, and is the straggler."""
    a = _summary(0, bwd_s=0.055)
    b = _summary(1, host="node1", late_s=0.025 - 5.0, data_s=0.027)
    a["clock"], b["clock"] = [0, 0], [5_000_000_000, 40_000]  # offset 5 s, error 40 µs
    ranks, findings = _merge([a, b])
    assert "clocks aligned to rank 0's" in ranks.arrivals_source and "40 µs" in ranks.arrivals_source
    assert ranks.clock_error_s == pytest.approx(40e-6)
    f = _straggler(findings)
    assert f is not None and f.rank == 1 and f.evidence["clock_error_ms"] == 0.04
    # an alignment too coarse to tell 25 ms apart says nothing
    b["clock"] = [5_000_000_000, 20_000_000]
    _, findings = _merge([a, b])
    assert _straggler(findings) is None


def test_per_rank_scores_against_the_fastest_and_against_its_own_best() -> None:
    """40 steps: rank 1 computes 25 % more than rank 0 throughout; rank 2 matches rank 0 for
    30 steps, then slows to twice its compute (a throttled device)."""
    steady = [0.020] * 40
    ranks, _ = _merge([_summary(0, steps=40, compute=steady),
                       _summary(1, steps=40, compute=[0.025] * 40),
                       _summary(2, steps=40, compute=[0.020] * 30 + [0.040] * 10)])
    s0, s1, s2 = ranks.ranks
    assert s0.score_vs_fastest == 1.0 and s0.score_vs_own_best == 1.0
    assert s1.score_vs_fastest == pytest.approx(0.8) and s1.score_vs_own_best == 1.0
    assert s2.score_vs_fastest == 1.0  # its median is still its old speed
    assert s2.score_vs_own_best == pytest.approx(0.5)


def test_the_rank_that_causes_the_waiting_is_named_when_arrival_order_is_chance() -> None:
    """FSDP-like: 14 collectives a step. Rank 1 is 20 ms late at the first of each step (its
    loop's own work between steps); at the other 13 rank 0 happens to arrive 0.1 ms after it,
    so rank 0 is last at 13 of 14. The wait each caused names rank 1, and why."""
    s0, s1 = _summary(0, fwd_s=0.025), _summary(1, fwd_s=0.005)
    t0, per_step = 1_000_000_000_000, 14
    for s, first_ms, rest_ms in ((s0, 0.0, 0.1), (s1, 20.0, 0.0)):
        s["arrivals"] = [["0", k * per_step + j,
                          t0 + int((k * STEP) * 1e9) + int(((first_ms if j == 0 else
                                                              20.0 + j + rest_ms)) * 1e6)]
                         for k in range(10) for j in range(per_step)]
        s["step_ends_ns"] = [t0 + int(((k + 1) * STEP) * 1e9) for k in range(10)]
        # the step less the phases: 20 ms more on rank 1 (its work between steps)
        s["phases"].update(data_wait=0.0, backward=0.010, optimizer=0.001)
    s0["step_time_mean_s"] = s1["step_time_mean_s"] = 0.040
    ranks, findings = _merge([s0, s1])
    e0, e1 = ranks.ranks
    assert (e0.last_arrivals, e1.last_arrivals) == (130, 10)
    # each collective is reached after every rank reached the one before: the waits add
    assert e1.caused_wait_s == pytest.approx(0.020)
    assert e0.caused_wait_s == pytest.approx(13 * 0.0001)
    f = _straggler(findings)
    assert f is not None and f.rank == 1
    assert f.evidence["share_of_wait_caused"] == pytest.approx(0.020 / 0.0213, abs=1e-3)
    assert f.evidence["outside_phases_excess_ms"] == pytest.approx(20.0)
    assert "spends 20.0 ms more per step outside data loading" in f.title


def _buckets(summary: dict[str, Any], per_step: int) -> dict[str, Any]:
    """The summary's steps with ``per_step`` gradient all-reduces each, enqueued 1 ms apart
    (DDP's buckets: enqueued without blocking, the host waits for them at backward's end)."""
    out = []
    for i, (g, _, t) in enumerate(summary["arrivals"]):
        out += [[g, i * per_step + j, t - (per_step - 1 - j) * 1_000_000]
                for j in range(per_step)]
    return {**summary, "arrivals": out}


def test_the_waits_at_the_buckets_of_one_step_count_once() -> None:
    """Rank 1 reads its data 25 ms slower and so arrives 25 ms late at each of the 4 bucket
    all-reduces of every step: rank 0 waits 25 ms a step (inside its backward), not 4 × 25."""
    ranks, findings = _merge([_buckets(_summary(0, bwd_s=0.055), 4),
                              _buckets(_summary(1, late_s=0.025, data_s=0.027), 4)])
    e0, e1 = ranks.ranks
    assert e0.collectives == 40 and e1.last_arrivals == 40
    assert e0.comm_wait_s == pytest.approx(0.025) and e1.lateness_s == pytest.approx(0.025)
    assert e1.caused_wait_s == pytest.approx(0.025)
    f = _straggler(findings)
    assert f is not None and f.rank == 1
    assert "waits 25.0 ms more per step for data than the median rank: its data pipeline" \
        in f.title and "DataLoader workers" in f.fix
    assert f.evidence["others_wait_ms_per_step"] == pytest.approx(25.0)
    assert f.evidence["compute_excess_ms"] == pytest.approx(0.0, abs=1e-6)
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.025 / STEP))


def test_waits_one_after_another_add_up() -> None:
    """4 micro-batches a step, each backward synced (2 buckets) and blocking until done; rank 1
    is 5 ms late at each: rank 0 waits 4 × 5 ms a step, once per micro-batch."""
    s0, s1 = _summary(0, bwd_s=0.040), _summary(1)
    t0 = 1_000_000_000_000
    for s, late_ms in ((s0, 0.0), (s1, 5.0)):
        s["arrivals"] = [["0", (k * 4 + m) * 2 + j,
                          t0 + int((k * STEP + (m * 8 + late_ms + j) * 1e-3) * 1e9)]
                         for k in range(10) for m in range(4) for j in range(2)]
    ranks, findings = _merge([s0, s1])
    e0, e1 = ranks.ranks
    assert e0.comm_wait_s == pytest.approx(0.020) and e1.lateness_s == pytest.approx(0.020)
    f = _straggler(findings)
    assert f is not None and f.rank == 1
    assert f.evidence["others_wait_ms_per_step"] == pytest.approx(20.0)


def _on(device: str, s: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**s, "device": device, "cpus_available": 2.0, **extra}


def test_on_shared_cpus_a_rank_held_off_them_is_low_and_blames_no_device() -> None:
    """Both ranks on one 2-CPU host, training on CPU: rank 1 computes 25 ms longer a step on
    the same CPU time (0.9 cores each) — the scheduler gave it less of the shared CPUs."""
    _, findings = _merge([_on("cpu", _summary(0, bwd_s=0.055, run_delay_s=0.002)),
                          _on("cpu", _summary(1, late_s=0.025, bwd_s=0.055,
                                              run_delay_s=0.006))])
    f = _straggler(findings)
    assert f is not None and f.rank == 1
    assert f.severity == "low" and f.ceiling_speedup is None  # below what a user can act on
    assert "computes 25.0 ms more per step" in f.title and "on no more CPU time" in f.title
    assert "the 2 ranks on node0 share its 2 CPUs (their processes use 1.80 cores" in f.title
    assert "waits 6.0 ms per step for a CPU (+4.0 ms against the others)" in f.title
    assert "device" not in f.title + f.fix and "throttl" not in f.title + f.fix
    assert f.evidence["others_wait_ms_per_step"] == pytest.approx(25.0)
    assert f.evidence["ranks_on_host"] == 2 and f.evidence["cpu_time_excess_ms"] == 0.0


def test_on_cpu_a_rank_with_more_work_shows_it_in_cpu_time() -> None:
    """Rank 1 computes 25 ms more a step and its process spends 25 ms more CPU time a step:
    more work, a cause in the job, ranked by its ceiling."""
    _, findings = _merge([_on("cpu", _summary(0, bwd_s=0.055, cpu=0.5)),
                          _on("cpu", _summary(1, late_s=0.025, bwd_s=0.055,
                                              cpu=0.5 + 0.025 / STEP))])
    f = _straggler(findings)
    assert f is not None and f.severity == "high" and f.ceiling_speedup is not None
    assert "its process uses 25.0 ms more CPU time per step: more work than the others" \
        in f.title
    assert "device" not in f.title + f.fix
    assert f.evidence["cpu_time_excess_of"] == "process"  # no training thread's reading


def test_on_cpu_more_work_is_judged_on_the_training_thread_not_the_process() -> None:
    """Both processes spend 20 ms more CPU a step on rank 1 — its communication thread, which
    receives the others' data while rank 1 computes — but the training threads spend the
    same: no more work, the shared CPUs' doing. Where rank 1's training thread itself spends
    the 25 ms more, it is more work."""
    def ranks(thread_cpu_1: float) -> list[dict[str, Any]]:
        return [_on("cpu", _summary(0, bwd_s=0.055, cpu=0.8), main_thread_cpu_cores=0.4),
                _on("cpu", _summary(1, late_s=0.025, bwd_s=0.055, cpu=0.8 + 0.020 / STEP),
                    main_thread_cpu_cores=thread_cpu_1)]
    f = _straggler(_merge(ranks(0.4))[1])
    assert f is not None and f.rank == 1
    assert f.severity == "low" and f.ceiling_speedup is None
    assert "on no more CPU time" in f.title and "more work" not in f.title
    assert f.evidence["cpu_time_excess_ms"] == 0.0
    assert f.evidence["cpu_time_excess_of"] == "training thread"
    assert f.evidence["training_thread_cpu_cores"] == 0.4
    f = _straggler(_merge(ranks(0.4 + 0.025 / STEP))[1])
    assert f is not None and f.severity == "high" and f.ceiling_speedup is not None
    assert "its training thread uses 25.0 ms more CPU time per step: more work" in f.title
    assert f.evidence["cpu_time_excess_ms"] == pytest.approx(25.0)


def test_a_gpu_is_called_throttled_only_on_its_own_clock_events() -> None:
    slow = _summary(1, late_s=0.025, bwd_s=0.055)
    _, findings = _merge([_on("cuda", _summary(0, bwd_s=0.055), device_clock_events=[]),
                          _on("cuda", slow, device_clock_events=["gpu_idle"])])
    f = _straggler(findings)
    assert f is not None and "throttl" not in f.title + f.fix and f.severity == "high"
    _, findings = _merge([_on("cuda", _summary(0, bwd_s=0.055), device_clock_events=[]),
                          _on("cuda", slow, device_clock_events=["hw_thermal_slowdown"])])
    f = _straggler(findings)
    assert f is not None and "its GPU lowered its clocks (hw_thermal_slowdown, NVML)" in f.title
    assert "throttles" in f.fix


def test_on_cpu_a_rank_alone_on_its_host_is_not_said_to_share_it() -> None:
    """One rank per host (clocks aligned, no offset): rank 1 computes 25 ms longer on the same
    CPU time, and no rank of the job is on its host to share its CPUs with."""
    _, findings = _merge([
        _on("cpu", _summary(0, bwd_s=0.055)) | {"clock": [0, 0]},
        _on("cpu", _summary(1, host="node1", late_s=0.025, bwd_s=0.055)) | {"clock": [0, 0]}])
    f = _straggler(findings)
    assert f is not None and f.rank == 1 and f.severity == "high"
    assert "on no more CPU time than the others: other processes or slower CPUs on node1" \
        in f.title and "share" not in f.title and "device" not in f.title + f.fix


@pytest.mark.parametrize(("cpu_ms", "delay_ms", "verdict"),
                         [(8.0, 15.0, "more work"), (10.0, 22.0, "share its 2 CPUs")])
def test_on_a_loaded_host_cpu_time_and_run_delay_split_the_extra_compute(
        cpu_ms: float, delay_ms: float, verdict: str) -> None:
    """Rank 1 computes 25 ms more a step. 8 ms more CPU time with 15 ms more run delay: it has
    work of its own, stretched by the load. 22 ms more run delay: the scheduler's doing
    (≥ 80 % of it), whatever its CPU time."""
    _, findings = _merge([
        _on("cpu", _summary(0, bwd_s=0.055, cpu=0.07, run_delay_s=0.001)),
        _on("cpu", _summary(1, late_s=0.025, bwd_s=0.055, cpu=0.07 + cpu_ms / 1e3 / STEP,
                            run_delay_s=0.001 + delay_ms / 1e3))])
    f = _straggler(findings)
    assert f is not None and f.rank == 1 and verdict in f.title
    assert (f.severity == "low") == (verdict != "more work")


# -- a rank whose process has ended is not waited for --------------------------------------------
def test_a_process_is_called_ended_only_when_it_surely_is() -> None:
    import subprocess
    import sys

    from redline.measure.ranks import process_ended, process_identity

    assert not process_ended(process_identity())  # this one runs
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = process_identity().rsplit(b"\n", 1)[0] + f"\n{child.pid}".encode()
    deadline = time.monotonic() + 30
    while not process_ended(ident) and time.monotonic() < deadline:  # a zombie: not reaped
        time.sleep(0.01)
    assert process_ended(ident)
    child.wait()
    assert process_ended(ident)  # reaped: gone
    host, boot, namespace, _ = ident.decode().split("\n")
    for other in (f"elsewhere\n{boot}\n{namespace}\n{child.pid}",
                  f"{host}\nanother-boot\n{namespace}\n{child.pid}",
                  f"{host}\n{boot}\npid:[1]\n{child.pid}",
                  f"{host}\n{boot}\nunknown\n{child.pid}",
                  f"{host}\n{namespace}\n{child.pid}", "garbage", "\xff"):
        assert not process_ended(other.encode()), other  # nothing known: never called ended
    # a process this user may not signal (PID 1 here is root's; as root, it runs): not ended
    assert not process_ended(f"{host}\n{boot}\n{namespace}\n1".encode())


def test_the_gather_stops_waiting_for_a_writer_that_ended() -> None:
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    from redline.measure.ranks import ENDED_GRACE_S, JobStore, RankInfo

    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10),
                      wait_for_workers=False)
    store = JobStore.__new__(JobStore)
    store.info = RankInfo(rank=0, world_size=3, local_rank=0, local_world_size=3, host="h",
                          run_id="t.0")
    store._store, store.prefix = server, "redline/t.0"
    store.put("rank1", b"one")
    asked: list[str] = []

    late = TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                    timeout=timedelta(seconds=10))  # the ended writer's own connection

    def gone(key: str) -> bool:
        asked.append(key)
        if key == "rank3" and asked.count(key) == 1:
            # its value reaches the store after its writer is seen to have ended
            threading.Timer(0.3, lambda: late.set("redline/t.0/rank3", b"three")).start()
        return key in ("rank2", "rank3")

    t = time.monotonic()
    got = store.gather(["rank1", "rank2", "rank3", "rank4"], timeout_s=2.5, gone=gone)
    assert got == {"rank1": b"one", "rank3": b"three"}
    assert "rank1" not in asked  # present: never looked up
    assert time.monotonic() - t >= 2.5  # rank4 was waited for: not known to have ended
    t = time.monotonic()
    assert store.gather(["rank2"], timeout_s=30, gone=gone) == {}
    assert ENDED_GRACE_S <= time.monotonic() - t < ENDED_GRACE_S + 4


def _bimodal_entry(rank: int, host: str, run_delay_s: float | None) -> RankEntry:
    return RankEntry(rank=rank, local_rank=rank, host=host, status="completed", steps_measured=50,
                     last_step=53, step_time_mean_s=0.0063, data_wait_s=0.0004, h2d_copy_s=0.0,
                     forward_s=0.0006, backward_s=0.0042, optimizer_s=0.001, comm_s=0.0036,
                     comm_wait_s=0.0007, transfer_s=0.0029, throughput_samples_per_s=1e4,
                     main_cpu_cores=0.7, collectives=100, last_arrivals=50, lateness_s=0.0006,
                     run_delay_s=run_delay_s)


def _bimodal(phase: str = "backward", extra: float = 0.29) -> Finding:
    return Finding(id="step_time_bimodal", severity="medium", title="two levels",
                   evidence={"extra_fraction": extra, "phase": phase}, ceiling_speedup=1.4,
                   fix="find what differs")


def test_two_levels_that_the_hosts_cpu_waits_explain_are_left_out_of_the_job_report() -> None:
    """Each rank waited ~0.85 ms a step for a CPU, alone under half of the slow level's
    ~1.8 ms a step; the two on one host together explain it, since every step waits at the
    all-reduce for the last rank."""
    from redline.diagnose.ranks import bimodal_is_the_hosts
    from redline.runs.ranks import _merge_findings

    shared = RanksReport(world_size=2, missing=[], merged={}, arrivals_source="test",
                         ranks=[_bimodal_entry(0, "a", 0.00081), _bimodal_entry(1, "a", 0.00088)])
    assert bimodal_is_the_hosts(shared, 0, _bimodal())
    others = {1: {"findings": [dataclasses.asdict(_bimodal())]}}
    assert "step_time_bimodal" not in {f.id for f in _merge_findings([_bimodal()], others, shared)}
    # ranks on two hosts: each host's one rank waited too little to explain it
    apart = dataclasses.replace(shared, ranks=[_bimodal_entry(0, "a", 0.00081),
                                               _bimodal_entry(1, "b", 0.00088)])
    assert not bimodal_is_the_hosts(apart, 0, _bimodal())
    kept = _merge_findings([_bimodal()], others, apart)
    assert [f.id for f in kept] == ["step_time_bimodal"] and kept[0].rank is None
    # a difference in a phase without collectives is the job's own, whatever the waits
    assert not bimodal_is_the_hosts(shared, 0, _bimodal(phase="data_wait"))
    # eight ranks of a node each waiting ~2 % of their steps: not a contended host, however
    # much their waits sum to
    node = dataclasses.replace(shared, world_size=8,
                               ranks=[_bimodal_entry(k, "a", 0.00015) for k in range(8)])
    assert not bimodal_is_the_hosts(node, 0, _bimodal())
    # a wait that is unknown on one rank decides nothing
    unknown = dataclasses.replace(shared, ranks=[_bimodal_entry(0, "a", 0.00081),
                                                 _bimodal_entry(1, "a", None)])
    assert not bimodal_is_the_hosts(unknown, 0, _bimodal())
