"""Each finding rule fires on the numbers it is meant for, and stays silent otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from factories import H2DMetrics, loader, measurements
from redline.core.findings import CATALOGUE, ceiling_speedup
from redline.core.measurements import (
    CodeSite,
    CompetingProcess,
    DdpStats,
    FsdpStats,
    LoopWork,
    MemoryCurve,
    MemoryTimeline,
    PeriodicStall,
    StepDrift,
    StepModes,
    StepTrend,
)
from redline.diagnose import (
    JOB_RULES,
    NOT_DIAGNOSED,
    RANK_RULES,
    RULES,
    TRACE_RULES,
    diagnose,
    stall_note,
)
from redline.diagnose.data import suggested_workers


def ids(m) -> list[str]:
    return [f.id for f in diagnose(m)]


def get(m, fid):
    return next(f for f in diagnose(m) if f.id == fid)


def _ddp(*, backward: float = 1.0, reduces: float | None = 1.0, buckets: int = 1,
         find_unused: bool = False, cap_mib: int = 25, view: bool = True,
         params_mib: float = 10.0, comm_s: float | None = 0.012,
         overlap_s: float | None = 0.002, unused: int = 0,
         static: bool = False) -> DdpStats:
    return DdpStats(backend="gloo", find_unused_parameters=find_unused, unused_parameter_bytes=unused,
                    gradient_as_bucket_view=view, bucket_cap_bytes=cap_mib * 2**20,
                    bucket_sizes_bytes=[int(params_mib * 2**20 / buckets)] * buckets,
                                            parameter_bytes=int(params_mib * 2**20),
                    backward_comm_s=comm_s, backward_overlap_s=overlap_s, backward_per_step=backward,
                    all_reduces_per_step=reduces, static_graph=static)


def test_sync_every_microbatch_from_counted_all_reduces() -> None:
    """4 micro-batches per step, 2 buckets: 8 all-reduces per step without no_sync, 2 with."""
    m = measurements(ddp=_ddp(backward=4, reduces=8, buckets=2))
    f = get(m, "sync_every_microbatch")
    assert f.evidence["extra_all_reduces_per_step"] == 6
    # 3 removable backward syncs of (12 − 2) ms exposed each, in a 100 ms step
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 3 * 0.010 / 0.1))
    assert "no_sync()" in f.fix and "set_requires_gradient_sync" in f.fix
    assert "sync_every_microbatch" not in ids(measurements(ddp=_ddp(backward=4, reduces=2,
                                                                     buckets=2)))
    assert "sync_every_microbatch" not in ids(measurements(ddp=_ddp(backward=1, reduces=2,
                                                                     buckets=2)))
    unknown = get(measurements(ddp=_ddp(backward=4, reduces=8, buckets=2, comm_s=None)),
                  "sync_every_microbatch")
    assert unknown.ceiling_speedup is None


def test_fsdp_sync_every_microbatch_from_counted_reductions() -> None:
    """FSDP2, 3 fully_shard groups, 4 micro-batches: 12 reductions per step unsynced, 3 with
    set_requires_gradient_sync(False) on all but the last."""
    f = get(measurements(fsdp=FsdpStats(groups=3, backward_per_step=4.0, reductions_per_step=12.0)),
            "sync_every_microbatch")
    assert f.evidence["extra_reductions_per_step"] == 9 and f.ceiling_speedup is None
    assert "set_requires_gradient_sync(is_last)" in f.fix and "no_sync" not in f.fix
    for quiet in (FsdpStats(groups=3, backward_per_step=4.0, reductions_per_step=3.0),
                  FsdpStats(groups=3, backward_per_step=1.0, reductions_per_step=3.0),
                  FsdpStats(groups=3, backward_per_step=None, reductions_per_step=12.0),
                  FsdpStats(groups=3, backward_per_step=4.0, reductions_per_step=None)):
        assert "sync_every_microbatch" not in ids(measurements(fsdp=quiet))


def test_ddp_knobs_each_from_their_evidence() -> None:
    assert "unused_parameter_search" in ids(measurements(ddp=_ddp(find_unused=True)))
    assert "unused_parameter_search" not in ids(measurements(ddp=_ddp()))
    skips = measurements(ddp=_ddp(find_unused=True, unused=80))
    assert "unused_parameter_search" not in ids(skips)  # the search finds something: needed
    sg = get(skips, "ddp_static_graph")
    assert sg.evidence["unused_parameter_bytes"] == 80 and "static_graph=True" in sg.fix
    for quiet in (_ddp(find_unused=True, unused=80, static=True), _ddp(unused=80),
                  _ddp(find_unused=True)):
        assert "ddp_static_graph" not in ids(measurements(ddp=quiet))
    small = get(measurements(ddp=_ddp(cap_mib=1, buckets=40, params_mib=40)), "small_ddp_buckets")
    assert small.evidence["buckets"] == 40
    assert "small_ddp_buckets" not in ids(measurements(ddp=_ddp(cap_mib=25, buckets=40)))
    assert "gradient_bucket_copies" in ids(measurements(ddp=_ddp(view=False, params_mib=400)))
    assert "gradient_bucket_copies" not in ids(measurements(ddp=_ddp(view=False)))


def test_ceiling_speedup_is_amdahl() -> None:
    assert ceiling_speedup(0.5) == pytest.approx(2.0)
    assert ceiling_speedup(0.0) == 1.0
    assert ceiling_speedup(0.75) == pytest.approx(4.0)
    assert ceiling_speedup(1.0) is None


def test_every_finding_id_is_in_the_catalogue() -> None:
    m = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.5})
    assert set(ids(m)) <= set(CATALOGUE)


def test_the_registry_covers_the_catalogue() -> None:
    """Every catalogue id has a rule, or says why it has none; no rule is for an id outside
    the catalogue."""
    ruled = set(RULES) | set(TRACE_RULES) | set(JOB_RULES) | set(RANK_RULES)
    assert ruled <= set(CATALOGUE)
    assert ruled | set(NOT_DIAGNOSED) == set(CATALOGUE)
    assert not ruled & set(NOT_DIAGNOSED)
    assert all(NOT_DIAGNOSED.values())


def test_each_rule_reports_only_its_own_id() -> None:
    h2d = H2DMetrics(copies_per_step=2, bytes_per_step=20e6, pageable_fraction=1.0,
                     host_s_per_step=0.02)
    big = {"path": "dataset.paths", "type": "list", "items": 1_000_000, "est_bytes": 150 * 2**20}
    cases = [
        measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.4, "workers_cpu_cores": 1.0,
                           "torch_threads": 2, "shm_free_bytes": 2**20},
                     loaders=[loader(num_workers=2, prefetch_factor=2, worker_starts=3,
                                     iterators=3, worker_startup_mean_s=1.0,
                                     worker_startup_total_s=3.0, python_containers=[big])]),
        measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3", precision="fp32",
                     phases={"h2d_copy": 0.2},
                     dev={"h2d": h2d, "device_span_fraction": 0.4, "sync_calls": 40,
                          "sync_calls_per_step": 2.0, "peak_reserved_bytes": 2**30,
                          "sync_sites": [{"site": "train.py:42", "count": 40}]}),
    ]
    cases.append(measurements(ddp=_ddp(find_unused=True, cap_mib=1, buckets=40, backward=4,
                                       reduces=160,
                                       view=False, params_mib=400)))
    cases.append(measurements(ddp=_ddp(find_unused=True, unused=80)))
    cases.append(measurements(phases={"data_wait": 0.6, "forward": 0.2},
                              host={"data_fetch_cpu_fraction": 0.1, "read_bytes_per_s": 5e7}))
    cases.append(measurements(phases={"data_wait": 0.6, "forward": 0.2},
                              host={"data_fetch_cpu_fraction": 0.2,
                                    "data_fetch_run_delay_fraction": 0.7,
                                    "other_processes_cpu_cores": 1.5}))
    cases.append(measurements(phases={"evaluation": 0.3, "forward": 0.2}))
    sites = [CodeSite(file="t.py", line=i, function="f", kind=k, via=None, step_fraction=0.15,
                      samples=10, text=None)
             for i, k in enumerate(("checkpoint", "logging", "batch", "code"))]
    periodic = PeriodicStall(period_steps=4, slow_steps=5, extra_s_per_slow_step=0.1,
                             step_fraction=0.1, phase="data_wait", site=None)
    loop = LoopWork(other_fraction=0.6, sampled_s=1.0, samples=40, interval_s=0.005,
                    sites=sites, kind_fractions={s.kind: 0.15 for s in sites},
                    gc_pause_fraction=0.2, gc_collections=[10, 2, 5], gc_full_sites=[],
                    periodic=periodic)
    cases.append(dataclasses.replace(measurements(phases={"forward": 0.3}, data_source="not seen"),
                                     loop=loop))
    curve = MemoryCurve(kind="host_rss", process="main", pid=7, t_s=[0.0, 60.0],
                        steps=[0, 600], bytes=[2**30, 2**30 + 600 * 2**20], start_bytes=2**30,
                        end_bytes=2**30 + 600 * 2**20, peak_bytes=2**30 + 600 * 2**20,
                        window_s=60.0, window_samples=300, slope_bytes_per_1k_steps=2**30,
                        slope_bytes_per_hour=36_000 * 2**20,
                        late_slope_bytes_per_hour=36_000 * 2**20, trend_z=9.0,
                        noise_bytes=2**20, limit_bytes=8 * 2**30, limit_source="MemAvailable",
                        hours_to_limit=0.2)
    trend = StepTrend(steps=600, slope_s_per_1k_steps=0.05, slope_s_per_hour=5.0,
                      trend_z=12.0, start_s=0.08, end_s=0.11, noise_s=0.004, rise_fraction=0.33,
                      extra_fraction=0.12, phase="forward", phase_slope_s_per_1k_steps=0.05,
                      run_delay_rise_s=0.0)
    modes = StepModes(fast_s=0.08, slow_s=0.16, slow_share=0.3, separation=9.0,
                      slow_first_half_share=0.5, extra_fraction=0.2, phase="data_wait",
                      run_delay_fraction=0.0)
    cases.append(dataclasses.replace(
        measurements(), memory=MemoryTimeline(interval_s=0.2, samples=300, curves=[curve]),
        drift=StepDrift(startup=None, trend=trend, modes=None)))
    # two levels with no trend (a drift's early and late steps are its own)
    cases.append(dataclasses.replace(measurements(), drift=StepDrift(
        startup=None, trend=dataclasses.replace(trend, trend_z=0.5), modes=modes)))
    fired = set()
    for m in cases:
        for fid, rule in RULES.items():
            out = rule(m)
            assert {f.id for f in out} <= {fid}
            fired |= {f.id for f in out}
    assert fired == set(RULES)


def test_data_starvation_in_process_cpu_bound() -> None:
    m = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.95})
    f = get(m, "data_starvation")
    assert f.severity == "high"
    assert f.ceiling_speedup == pytest.approx(1 / 0.4)
    assert "num_workers=1" in f.fix  # 2 CPUs − 1
    assert "cpu_preprocessing" in ids(m) and "storage_fetch" not in ids(m)
    assert get(m, "cpu_preprocessing").ceiling_speedup == pytest.approx(1 / (1 - 0.6 * 0.95))


def test_a_saturating_training_process_gets_workers_and_the_cores_they_need() -> None:
    """num_workers=0 and the training process alone keeps both CPUs busy: workers, and fewer
    intra-op threads to leave them cores, not workers alone."""
    m = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.95, "main_cpu_cores": 1.95})
    fix = get(m, "data_starvation").fix
    assert "num_workers=1" in fix and "torch.set_num_threads(1)" in fix


def test_cpu_work_in_a_tensor_dataset_fetch_is_per_sample_indexing_not_decoding() -> None:
    m = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.95},
                     loaders=[loader(num_workers=0, dataset_type="TensorDataset")])
    fix = get(m, "cpu_preprocessing").fix
    assert "BatchSampler(RandomSampler(ds), batch_size=B" in fix
    assert "decode" not in fix and "CachedDataset" not in fix
    other = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                         host={"data_fetch_cpu_fraction": 0.95})
    assert "CachedDataset" in get(other, "cpu_preprocessing").fix


def test_data_split_reports_both_sides_when_mixed() -> None:
    m = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                     host={"data_fetch_cpu_fraction": 0.4})
    assert {"fetch_wait", "cpu_preprocessing"} <= set(ids(m))
    assert ids(m)[0] == "data_starvation"  # the whole wait ranks above either part


def test_data_starvation_with_saturated_workers_says_more_workers_wont_help() -> None:
    m = measurements(phases={"data_wait": 0.5, "forward": 0.2, "backward": 0.2},
                     host={"workers_cpu_cores": 1.9, "main_cpu_cores": 0.3},
                     loaders=[loader(num_workers=2, prefetch_factor=2)], torch_threads=1)
    f = get(m, "data_starvation")
    assert "saturated" in f.fix
    assert get(m, "cpu_preprocessing").evidence["workers_cpu_cores"] == 1.9


def test_small_data_wait_is_not_starvation() -> None:
    m = measurements(phases={"data_wait": 0.03}, host={"data_fetch_cpu_fraction": 1.0})
    assert "data_starvation" not in ids(m)


def test_suggested_workers() -> None:
    assert suggested_workers(2) == 1
    assert suggested_workers(16) == 15
    assert suggested_workers(16, local_world_size=8) == 1
    assert suggested_workers(1) == 1


def test_thread_oversubscription() -> None:
    m = measurements(host={"workers_cpu_cores": 1.5, "torch_threads": 2},
                     loaders=[loader(num_workers=2, prefetch_factor=2)])
    f = get(m, "thread_oversubscription")
    assert "torch.set_num_threads(1)" in f.fix
    assert f.ceiling_speedup is None
    ok = measurements(host={"workers_cpu_cores": 1.5, "torch_threads": 1, "cpus_available": 4.0},
                      loaders=[loader(num_workers=2, prefetch_factor=2)])
    assert "thread_oversubscription" not in ids(ok)


def test_shm_too_small() -> None:
    batch = 32 * 3 * 224 * 224 * 4  # 18.4 MiB
    m = measurements(host={"shm_free_bytes": 64 * 2**20},
                     loaders=[loader(num_workers=4, prefetch_factor=2, batch_bytes=batch)])
    f = get(m, "shm_too_small")
    assert f.severity == "high"
    assert f.evidence["needed_mib"] == pytest.approx(4 * 2 * batch / 2**20, rel=1e-3)
    roomy = measurements(host={"shm_free_bytes": 8 * 2**30},
                         loaders=[loader(num_workers=4, prefetch_factor=2, batch_bytes=batch)])
    assert "shm_too_small" not in ids(roomy)


def test_copy_on_access_dataset() -> None:
    big = {"path": "dataset.paths", "type": "list", "items": 1_000_000, "est_bytes": 150 * 2**20}
    m = measurements(loaders=[loader(num_workers=8, prefetch_factor=2, python_containers=[big])])
    f = get(m, "copy_on_access_dataset")
    assert f.evidence["projected_copies_mib"] == pytest.approx(8 * 150)
    assert f.severity == "high"
    no_workers = measurements(loaders=[loader(num_workers=0, python_containers=[big])])
    assert "copy_on_access_dataset" not in ids(no_workers)


def test_worker_respawn() -> None:
    li = loader(num_workers=4, prefetch_factor=2, worker_starts=3, iterators=3,
                worker_startup_mean_s=1.0, worker_startup_total_s=3.0)
    m = measurements(loaders=[li])
    f = get(m, "worker_respawn")
    # 2 removable restarts of 1 s against 24 steps × 0.1 s of wall
    assert f.evidence["share_of_wall"] == pytest.approx(2.0 / (2.4 + 2.0), rel=1e-3)
    assert "persistent_workers=True" in f.fix
    assert "worker_respawn" not in ids(measurements(loaders=[
        loader(num_workers=4, persistent_workers=True, worker_starts=1, iterators=3,
               worker_startup_mean_s=1.0, worker_startup_total_s=1.0)]))


def test_h2d_copy() -> None:
    h2d = H2DMetrics(copies_per_step=2, bytes_per_step=20e6, pageable_fraction=1.0,
                     host_s_per_step=0.02)
    m = measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3",
                     phases={"h2d_copy": 0.2}, dev={"h2d": h2d}, precision="bf16-autocast")
    f = get(m, "h2d_copy")
    assert f.ceiling_speedup == pytest.approx(1.25)
    assert "pin_memory=True" in f.fix and "non_blocking=True" in f.fix


def test_host_sync() -> None:
    m = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                     dev={"sync_calls": 40, "sync_calls_per_step": 2.0,
                          "sync_sites": [{"site": "train.py:42", "count": 40}]})
    f = get(m, "host_sync")
    assert "train.py:42" in f.fix
    assert f.ceiling_speedup is None


def test_small_batch() -> None:
    m = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                     dev={"device_span_fraction": 0.4, "peak_reserved_bytes": 8 * 2**30})
    f = get(m, "small_batch")
    assert f.ceiling_speedup == pytest.approx(1 / 0.4)
    full = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                        dev={"device_span_fraction": 0.4, "peak_reserved_bytes": 70 * 2**30})
    assert "small_batch" not in ids(full)


def test_small_batch_does_not_claim_the_idle_time_the_data_wait_explains() -> None:
    """ResNet-50's naive loop on an H200: the device works 38 % of the step and the loop waits
    62 % of it for data. A larger batch would not feed it faster: data_starvation, not
    small_batch, names that idle time. With part of the idle left unexplained, small_batch
    claims that part only."""
    starved = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                           phases={"data_wait": 0.616, "forward": 0.13, "backward": 0.2},
                           dev={"device_span_fraction": 0.379, "peak_reserved_bytes": 2**30})
    assert "data_starvation" in ids(starved) and "small_batch" not in ids(starved)
    partly = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                          phases={"data_wait": 0.2, "forward": 0.13, "backward": 0.2},
                          dev={"device_span_fraction": 0.4, "peak_reserved_bytes": 2**30})
    f = get(partly, "small_batch")
    assert f.evidence["idle_not_data_fraction"] == pytest.approx(0.4)
    assert f.ceiling_speedup == pytest.approx(1 / 0.6)


def test_small_batch_on_cpu_from_fixed_per_step_costs() -> None:
    """The optimizer's update (fixed per step) is 60 % of a CPU step: small_batch with the
    fixed and per-sample parts, and Amdahl's projection; a compute-bound step is quiet."""
    m = measurements(phases={"optimizer": 0.6, "forward": 0.1, "backward": 0.2})
    f = get(m, "small_batch")
    assert f.evidence["fixed_ms_per_step"] == pytest.approx(60.0)  # of the factory's 100 ms
    assert f.evidence["per_sample_ms"] == pytest.approx(30.0 / 32, abs=1e-4)
    assert f.evidence["projected_throughput_gain_at_4x_batch"] == pytest.approx(
        1 / (0.6 / 4 + 0.4), abs=1e-3)
    assert f.ceiling_speedup == pytest.approx(1 / 0.4)
    assert "small_batch" not in ids(measurements(phases={"optimizer": 0.3, "forward": 0.3,
                                                         "backward": 0.4}))
    # a busy GPU hides the host's fixed costs: not small_batch from them
    busy = measurements(device="cuda", cc="9.0", precision="bf16-autocast",
                        phases={"optimizer": 0.6, "forward": 0.1, "backward": 0.2},
                        dev={"device_span_fraction": 0.95, "peak_reserved_bytes": 70 * 2**30})
    assert "small_batch" not in ids(busy)


def test_no_mixed_precision_and_tf32_on_hopper() -> None:
    m = measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3", precision="fp32",
                     dev={"device_span_fraction": 0.9})
    f = get(m, "no_mixed_precision")
    # compute 90 % at fp32 67 TF vs bf16 989.5 TF → ceiling 1 / (1 − 0.9·(1 − 67/989.5))
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.9 * (1 - 67 / 989.5)))
    assert "bfloat16" in f.fix
    t = get(m, "fp32_matmul_on_tensor_cores")
    assert t.ceiling_speedup == pytest.approx(1 / (1 - 0.9 * (1 - 67 / 494.5)))
    assert "set_float32_matmul_precision('high')" in t.fix


def test_no_mixed_precision_on_volta_suggests_fp16_scaler_and_no_tf32() -> None:
    m = measurements(device="cuda", cc="7.0", name="Tesla V100-SXM2-16GB", precision="fp32",
                     dev={"device_span_fraction": 0.9})
    assert "GradScaler" in get(m, "no_mixed_precision").fix
    assert "fp32_matmul_on_tensor_cores" not in ids(m)


def test_already_mixed_precision_is_quiet() -> None:
    m = measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3",
                     precision="bf16-autocast", dev={"device_span_fraction": 0.95})
    assert not {"no_mixed_precision", "fp32_matmul_on_tensor_cores"} & set(ids(m))


def test_findings_ranked_by_ceiling() -> None:
    h2d = H2DMetrics(copies_per_step=2, bytes_per_step=20e6, pageable_fraction=1.0,
                     host_s_per_step=0.01)
    m = measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3",
                     phases={"data_wait": 0.5, "h2d_copy": 0.1, "forward": 0.1, "backward": 0.1},
                     host={"data_fetch_cpu_fraction": 0.9}, dev={"h2d": h2d})
    ceilings = [f.ceiling_speedup for f in diagnose(m)]
    known = [c for c in ceilings if c is not None]
    assert len(known) >= 3 and known == sorted(known, reverse=True)
    # Findings without a ceiling (here host syncs) come after every one with a ceiling.
    with_sync = measurements(device="cuda", cc="9.0", name="NVIDIA H100 80GB HBM3",
                             phases={"data_wait": 0.5, "h2d_copy": 0.1, "forward": 0.1,
                                     "backward": 0.1},
                             host={"data_fetch_cpu_fraction": 0.9},
                             dev={"h2d": h2d, "sync_calls": 40, "sync_calls_per_step": 2.0,
                                  "sync_sites": [{"site": "train.py:42", "count": 40}]})
    ranked = [f.ceiling_speedup for f in diagnose(with_sync)]
    first_none = ranked.index(None)
    assert first_none >= 3 and all(c is None for c in ranked[first_none:])


def test_one_stalled_fetch_is_a_note_not_starvation() -> None:
    """The stall check, from controlled inputs: 8 % of the step waited, but without its slowest
    step the loop waits 1 % → a note naming that step, and no data finding."""
    m = measurements(phases={"data_wait": 0.08}, host={"data_fetch_cpu_fraction": 0.0})
    dw = m.share("data_wait")
    assert dw is not None
    dw.fraction_without_slowest, dw.slowest_step, dw.slowest_step_s = 0.01, 10, 0.3
    assert not set(ids(m)) & {"data_starvation", "cpu_preprocessing", "storage_fetch"}
    note = stall_note(m)
    assert note is not None and "step 10 waited 300.0 ms" in note and "not starvation" in note
    dw.fraction_without_slowest = 0.07  # steady waits: starvation, no stall note
    assert stall_note(m) is None and "data_starvation" in ids(m)


def test_a_fetch_that_waits_is_storage_fetch_only_with_reads_measured() -> None:
    reading = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                           host={"data_fetch_cpu_fraction": 0.02, "read_bytes_per_s": 4e7})
    assert "storage_fetch" in ids(reading) and "cpu_preprocessing" not in ids(reading)
    assert get(reading, "storage_fetch").ceiling_speedup == pytest.approx(1 / (1 - 0.6 * 0.98))
    assert get(reading, "storage_fetch").evidence["read_mb_per_s"] == 40.0
    # The same wait with nothing read: not storage (a socket, a lock, a sleep).
    silent = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                          host={"data_fetch_cpu_fraction": 0.02, "read_bytes_per_s": 0.0})
    assert "storage_fetch" not in ids(silent) and "fetch_wait" in ids(silent)
    assert "no storage reads measured" in get(silent, "fetch_wait").title
    # read() bytes served by the page cache or a network file system count as reads too.
    cached = measurements(phases={"data_wait": 0.6, "forward": 0.1, "backward": 0.2},
                          host={"data_fetch_cpu_fraction": 0.02, "read_chars_per_s": 2e6})
    assert "storage_fetch" in ids(cached)


def test_waiting_for_a_cpu_is_contention_and_names_the_competing_load() -> None:
    """Measured run delay, not a remainder: 20 % CPU, 70 % runnable waiting for a CPU, 10 %
    off-CPU. With other processes busy on the job's CPUs, they are named; without, the job's
    own threads are."""
    host = {"data_fetch_cpu_fraction": 0.2, "data_fetch_run_delay_fraction": 0.7}
    busy = measurements(phases={"data_wait": 0.6, "forward": 0.2},
                        host={**host, "other_processes_cpu_cores": 1.6})
    f = get(busy, "cpu_contention")
    assert "other processes keep 1.60 of the 2 usable CPUs busy" in f.title
    assert f.evidence["contention_share_of_wait"] == 0.7
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.6 * 0.7))
    assert not {"storage_fetch", "fetch_wait"} & set(ids(busy))  # 10 %: below the secondary
    own = measurements(phases={"data_wait": 0.6, "forward": 0.2},
                       host={**host, "other_processes_cpu_cores": 0.05})
    assert "own threads outnumber" in get(own, "cpu_contention").title


def test_the_training_threads_run_delay_is_contention_naming_the_processes() -> None:
    """The loop's thread runnable without a CPU 50 % of the window while a child the script
    started burns a core: one cpu_contention over the whole step, naming the child; the same
    delay with nothing else on the CPUs is the job's own threads (not this finding); a small
    delay beside a busy process is not worth one."""
    burner = CompetingProcess(pid=4242, command="python burn.py", cpu_s=1.9, cpu_cores=0.95,
                              child=True)
    other = CompetingProcess(pid=777, command="rsync -a /data /backup", cpu_s=0.4,
                             cpu_cores=0.2, child=False)
    m = measurements(host={"main_thread_run_delay_fraction": 0.5,
                           "competing_processes": [burner, other]})
    f = get(m, "cpu_contention")
    assert "pid 4242" in f.title and "a process the job started" in f.title
    assert f.evidence["top_competing_pid"] == 4242
    assert "pid 777 `rsync -a /data /backup`" in str(f.evidence["competing_processes"])
    assert f.evidence["competing_cpu_cores"] == pytest.approx(1.15)
    assert f.ceiling_speedup == pytest.approx(2.0)
    assert "child process pid 4242" in f.fix
    alone = measurements(host={"main_thread_run_delay_fraction": 0.5,
                               "competing_processes": []})
    assert "cpu_contention" not in ids(alone)
    small = measurements(host={"main_thread_run_delay_fraction": 0.1,
                               "competing_processes": [burner]})
    assert "cpu_contention" not in ids(small)
    # the fetch's part, where the loop's own delay is unknown, names them too
    fetch = measurements(phases={"data_wait": 0.6, "forward": 0.2},
                         host={"data_fetch_cpu_fraction": 0.2,
                               "data_fetch_run_delay_fraction": 0.7,
                               "other_processes_cpu_cores": 1.6,
                               "competing_processes": [other]})
    g = get(fetch, "cpu_contention")
    assert g.evidence["top_competing_pid"] == 777 and "fetcher waits" in g.title


def test_the_jobs_other_ranks_are_not_contention() -> None:
    """Two ranks of one job on a 2-core host wait for each other's CPU: that is the straggler
    rule's to explain (ranks sharing their host's CPUs), never cpu_contention against a process
    of the job itself."""
    rank1 = CompetingProcess(pid=5150, command="python -m redline.cli.main doctor -- train.py",
                             cpu_s=1.8, cpu_cores=0.9, child=False, same_job=True)
    m = measurements(host={"main_thread_run_delay_fraction": 0.45,
                           "competing_processes": [rank1]})
    assert "cpu_contention" not in ids(m)
    outsider = CompetingProcess(pid=31, command="ffmpeg -i a.mp4", cpu_s=1.0, cpu_cores=0.5,
                                child=False)
    both = measurements(host={"main_thread_run_delay_fraction": 0.45,
                              "competing_processes": [rank1, outsider]})
    f = get(both, "cpu_contention")
    assert f.evidence["top_competing_pid"] == 31 and "5150" not in str(f.evidence)


def test_a_process_of_the_same_job_is_known_by_its_rendezvous_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys

    from redline.measure import processes

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    other = {**env, "MASTER_PORT": "29999"}
    code = "import time; time.sleep(30)"
    same = subprocess.Popen([sys.executable, "-c", code], env=env)
    diff = subprocess.Popen([sys.executable, "-c", code], env=other)
    try:
        mine = processes._job_key({b"MASTER_ADDR": b"127.0.0.1", b"MASTER_PORT": b"29511"})
        assert mine is not None
        assert processes._job_key(processes._environ(same.pid)) == mine
        assert processes._job_key(processes._environ(diff.pid)) != mine
        assert processes._job_key({}) is None  # not a multi-process job: nothing excluded
    finally:
        same.kill()
        diff.kill()
        same.wait()
        diff.wait()


def test_workers_queueing_for_their_own_cores_are_cpu_bound_not_contention() -> None:
    """4 CPU-bound workers on 2 CPUs wait for a CPU half the time: that delay is the workers'
    own oversubscription (CPU work at capacity); delay beyond it is contention."""
    def found(delay: float, cores: float, others: float) -> set[str]:
        m = measurements(phases={"data_wait": 0.5, "forward": 0.2, "backward": 0.2},
                         host={"workers_cpu_cores": cores, "workers_run_delay_cores": delay,
                               "other_processes_cpu_cores": others, "main_cpu_cores": 0.1},
                         loaders=[loader(num_workers=4, prefetch_factor=2)])
        return set(ids(m)) & {"cpu_preprocessing", "cpu_contention", "fetch_wait"}

    assert found(delay=2.0, cores=2.0, others=0.0) == {"cpu_preprocessing"}
    # Others hold 1.8 of the 2 CPUs: the 4 runnable workers get 0.4; 2.0 of their 3.6 s of
    # delay is their own number, 1.6 the others'.
    assert found(delay=3.6, cores=0.4, others=1.8) == {"cpu_preprocessing", "cpu_contention"}

    def two(delay: float, cores: float) -> set[str]:
        m = measurements(phases={"data_wait": 0.5, "forward": 0.2, "backward": 0.2},
                         host={"workers_cpu_cores": cores, "workers_run_delay_cores": delay,
                               "other_processes_cpu_cores": 1.8, "main_cpu_cores": 0.1},
                         loaders=[loader(num_workers=2, prefetch_factor=2)])
        return set(ids(m)) & {"cpu_preprocessing", "cpu_contention", "fetch_wait"}

    assert two(delay=1.8, cores=0.2) == {"cpu_contention"}  # 2 workers fit 2 CPUs


def test_busy_workers_are_cpu_preprocessing_idle_ones_waiting() -> None:
    def split(cores: float) -> set[str]:
        m = measurements(phases={"data_wait": 0.5, "forward": 0.2, "backward": 0.2},
                         host={"workers_cpu_cores": cores, "main_cpu_cores": 0.3},
                         loaders=[loader(num_workers=2, prefetch_factor=2)])
        return set(ids(m)) & {"cpu_preprocessing", "storage_fetch", "fetch_wait"}

    assert split(1.8) == {"cpu_preprocessing"}  # 90 % of min(2 workers, 2 CPUs)
    assert split(0.1) == {"fetch_wait"}  # idle workers, nothing read
    assert split(1.0) == {"cpu_preprocessing", "fetch_wait"}  # half and half: both
