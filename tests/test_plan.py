"""`redline plan`: memory per GPU against published figures, the communication and bubble math,
activations counted on the meta device against the closed formula, a published configuration
ranked near the top, and the predicted model states of DDP / FSDP2 against live bytes under
torchrun."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rank_scripts import run_ranks
from redline.cli.main import main
from redline.plan import (
    Layout,
    PlanInputError,
    Training,
    activation_bytes,
    cluster,
    from_config_json,
    from_numbers,
    model_states,
    search,
    step_time,
)
from redline.plan.memory import activations_per_layer

SCRIPTS = Path(__file__).parent / "scripts"


def test_zero_model_states_match_the_papers_7_5b_example_on_64_gpus() -> None:
    """Rajbhandari et al. (ZeRO, SC20) Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam:
    DDP 120 GB, ZeRO-1 31.4 GB, ZeRO-2 16.6 GB, ZeRO-3 1.9 GB of model states."""
    spec = from_numbers(params=7.5e9)
    tr = Training(global_batch=64)
    got = []
    for z in range(4):
        m = model_states(spec, tr, Layout(dp=64, zero=z))
        got.append(round((m.of("parameters") + m.of("gradients") + m.of("optimizer state"))
                         / 1e9, 1))
    assert got == [120.0, 31.4, 16.6, 1.9]
    z1 = model_states(spec, tr, Layout(dp=64, zero=1))
    assert {t.name: t.formula for t in z1.terms}["optimizer state"].startswith("12·Ψ/64")


def test_deepspeed_estimators_where_their_assumptions_match() -> None:
    """DeepSpeed 0.19.8 estimate_zero2_model_states_mem_needs (no offload): 2P + 18P/N, its 18
    = 16-bit and fp32 gradients, fp32 parameters and Adam state — ours with fp32 gradient
    accumulation, exactly. estimate_zero3 (no offload): 4·largest layer + 18P/N; ours counts
    the 16-bit parameter shard (2P/N) as well, and two gathered blocks (2 × 2 bytes = its 4)."""
    p, n, largest = 7_000_000_000, 16, 200_000_000
    spec = dataclasses.replace(from_numbers(params=p, layers=35), largest_layer_params=largest)
    tr = Training(global_batch=16, fp32_grad_accumulation=True)
    z2 = model_states(spec, tr, Layout(dp=n, zero=2)).total_bytes
    assert z2 == pytest.approx(2 * p + 18 * p / n, rel=1e-9)
    z3 = model_states(spec, tr, Layout(dp=n, zero=3)).total_bytes
    ds3 = 4 * largest + 18 * p / n
    assert z3 - ds3 == pytest.approx(2 * p / n, rel=1e-6)
    # The DeepSpeed 1.5 "additional buffer factor" applies to host memory only; not modelled.


S, B, H, A, T = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize(("tp", "sp", "recompute", "flash", "expected"), [
    (1, False, "none", False, S * B * H * (34 + 5 * A * S / H)),
    (T, False, "none", False, S * B * H * (10 + 24 / T + 5 * A * S / (H * T))),
    (T, True, "none", False, S * B * H / T * (34 + 5 * A * S / H)),
    (T, True, "selective", False, 34 * S * B * H / T),
    (T, True, "full", False, 2 * S * B * H / T),
    (1, False, "full", False, 2 * S * B * H),
    (1, False, "none", True, 34 * S * B * H),  # FlashAttention: no s² term
])
def test_activation_formulas_are_korthikanti_et_al_table_2(tp: int, sp: bool, recompute: str,
                                                            flash: bool,
                                                            expected: float) -> None:
    """Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, per layer, 16-bit activations."""
    spec = from_numbers(params=175e9, layers=96, hidden=H, heads=A, seq=S, vocab=51200)
    tr = Training(global_batch=8, seq=S, flash_attention=flash)
    got, _ = activations_per_layer(spec, tr, Layout(dp=8, tp=tp, pp=1, zero=0, recompute=recompute,
                                                    offload=False, micro_batch=B, sequence_parallel=sp))
    assert got == pytest.approx(expected, rel=1e-12)


def test_pipeline_bubble_and_the_ring_all_reduce() -> None:
    spec = from_numbers(params=1e9, layers=16, hidden=2048, heads=16, seq=1024, vocab=32000)
    cl = cluster(16, "A100 80GB")
    tr = Training(global_batch=64, seq=1024)
    t = step_time(spec, tr, cl, Layout(dp=4, tp=1, pp=4, micro_batch=2))
    m = 64 // (4 * 2)
    assert t.bubble_fraction == pytest.approx((4 - 1) / (m + 4 - 1))
    iv = step_time(spec, tr, cl, Layout(dp=4, pp=4, micro_batch=2, virtual_stages=2))
    assert iv.bubble_fraction == pytest.approx((4 - 1) / (2 * m + 4 - 1))  # interleaved: ÷ v
    assert iv.pp_comm_s == pytest.approx(2 * t.pp_comm_s)
    t = step_time(spec, tr, cl, Layout(dp=16, micro_batch=4))
    grad_bytes = 2 * 1e9  # 16-bit gradients, replicated (DDP)
    bw = cl.inter_node_bytes_per_s * cl.bus_efficiency  # 16 GPUs: two nodes
    assert t.dp_comm_s == pytest.approx(2 * 15 / 16 * grad_bytes / bw)
    z3 = step_time(spec, tr, cl, Layout(dp=16, zero=3, micro_batch=4))
    # ZeRO-3: all-gather in forward and backward per micro-batch + one reduce-scatter = 3Ψ of
    # 16-bit traffic per micro-batch-step here (m = 1): 1.5 × the all-reduce's 2Ψ.
    assert z3.dp_comm_s == pytest.approx(1.5 * t.dp_comm_s)


def test_gpt3_175b_on_1024_a100s_ranks_megatrons_layout_near_the_top() -> None:
    """Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM" (SC21), Table 1 and the Megatron README: GPT-3 175B (96 layers, h 12288, 96
    heads, s 2048), global batch 1536 on 1024 A100s, TP 8 × PP 16 × DP 8, micro-batch 1."""
    spec = from_numbers(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)
    assert spec.params == pytest.approx(175e9, rel=0.01)
    res = search(spec, Training(global_batch=1536, seq=2048, flash_attention=False), cluster(1024,
                                                                                             "A100 80GB"))
    megatron = [c for c in res.ranked if (c.layout.tp, c.layout.pp, c.layout.dp,
                                          c.layout.micro_batch) == (8, 16, 8, 1)]
    assert megatron, "the paper's layout must fit"
    best = res.ranked[0]
    assert megatron[0].timing.step_s <= 1.15 * best.timing.step_s
    # Of every layout with pipeline stages, the paper's degrees are predicted fastest.
    piped = min((c for c in res.ranked if c.layout.pp > 1), key=lambda c: c.timing.step_s)
    assert (piped.layout.tp, piped.layout.pp, piped.layout.dp) == (8, 16, 8)
    # Tensor parallelism never leaves the node.
    assert all(c.layout.tp <= 8 for c in res.ranked)


def test_practice_a_model_that_fits_gets_ddp_and_the_global_batch_exactly() -> None:
    spec = from_numbers(layers=24, hidden=2048, heads=16, vocab=50257, seq=2048)  # ~1.3B
    res = search(spec, Training(global_batch=256, seq=2048), cluster(8, "H100"))
    best = res.ranked[0].layout
    assert (best.zero, best.tp, best.pp, best.recompute, best.offload) == (0, 1, 1, "none",
                                                                            False)
    for c in res.ranked:
        assert c.layout.micro_batch * res.accumulation(c.layout) * c.layout.dp == 256
        assert c.memory.total_bytes <= res.usable_bytes
    assert "no sharding is needed" in res.why


def test_a_model_too_large_for_the_cluster_says_by_how_much() -> None:
    spec = from_numbers(params=70e9, layers=80, hidden=8192, heads=64, seq=4096, vocab=32000)
    res = search(spec, Training(global_batch=8, seq=4096), cluster(8, "L4"))
    assert res.best is None
    assert "No layout of 8 × NVIDIA L4 fits" in res.why and "over the" in res.why


def test_config_json_counts_llama_style_and_gpt2_style_models(tmp_path: Path) -> None:
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "hidden_act": "silu", "rope_theta": 500000.0}))
    s = from_config_json(llama)
    assert s.params == pytest.approx(8.03e9, rel=0.005)  # Llama 3 8B
    assert (s.layers, s.hidden, s.heads, s.seq) == (32, 4096, 32, 8192)
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
                                "n_head": 12, "vocab_size": 50257, "n_positions": 1024}))
    assert from_config_json(gpt2).params == pytest.approx(124.4e6, rel=0.005)  # GPT-2 small


def test_bad_input_names_the_value_and_the_options(tmp_path: Path) -> None:
    with pytest.raises(PlanInputError, match=r"unknown GPU 'tpu-v5'; known: NVIDIA H200 SXM"):
        cluster(8, "tpu-v5")
    with pytest.raises(PlanInputError, match=r"`gpus` 12 is not a whole number of nodes of "
                                             r"`gpus_per_node` 8"):
        cluster(12, "H100")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 1024}))
    with pytest.raises(PlanInputError, match=r"lacks layers \(num_hidden_layers"):
        from_config_json(bad)
    with pytest.raises(PlanInputError, match="divides the global batch"):
        search(from_numbers(params=1e9), Training(global_batch=7, seq=1024), cluster(8, "H100"))
    with pytest.raises(PlanInputError, match="hidden size 1000 is not divisible by 16 heads"):
        from_numbers(params=1e9, hidden=1000, heads=16)


class _Block(nn.Module):
    """A GPT block as Korthikanti et al. count it: LayerNorm, QKV, explicit attention with
    softmax and dropout, projection, dropout, LayerNorm, 4h MLP with GELU, dropout."""

    def __init__(self, h: int, a: int, p: float = 0.1) -> None:
        super().__init__()
        self.a, self.p = a, p
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        d = h // self.a
        qkv = self.qkv(self.ln1(x)).view(s, b * self.a, 3 * d)
        q, k, v = (t.transpose(0, 1) for t in qkv.split(d, dim=-1))
        att = torch.bmm(q, k.transpose(1, 2)).mul_(1 / math.sqrt(d))
        att = F.dropout(att.softmax(-1), self.p, self.training)
        y = torch.bmm(att, v).transpose(0, 1).reshape(s, b, h)
        x = x + F.dropout(self.proj(y), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)


@pytest.mark.parametrize(("s", "h", "a"), [(128, 256, 8), (512, 512, 8), (64, 1024, 16)])
def test_activations_counted_on_meta_agree_with_the_formula(s: int, h: int, a: int) -> None:
    with torch.device("meta"):
        model = nn.Sequential(_Block(h, a), _Block(h, a))
    got = activation_bytes(model, lambda b: torch.empty(s, b, h, device="meta"),
                           lambda m, x: m(x), dtype=torch.bfloat16)
    formula = s * h * (34 + 5 * a * s / h) * 2  # per sample, two layers
    assert got.bytes_per_sample == pytest.approx(formula, rel=0.10)
    assert got.batches == (1, 2) and got.dtype == "bfloat16"


def test_activations_of_any_architecture_and_a_real_model_is_refused() -> None:
    with torch.device("meta"):
        conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.Flatten(), nn.Linear(16 * 32 * 32, 10))
    got = activation_bytes(conv, lambda b: torch.empty(b, 3, 32, 32, device="meta"),
                           lambda m, x: m(x).sum(), dtype=torch.bfloat16)
    # Kept for backward, in bf16: the conv output (BatchNorm's input) and the ReLU output
    # (ReLU's result, and the Linear's input as a flattened view); BatchNorm's own output is
    # freed once ReLU has read it. Per-channel statistics do not grow with the batch.
    assert got.bytes_per_sample == 2 * 16 * 32 * 32 * 2
    with pytest.raises(PlanInputError, match="meta device"):
        activation_bytes(nn.Linear(2, 2), lambda b: torch.empty(b, 2), lambda m, x: m(x))


def test_cli_writes_ranked_layouts_with_terms_formulas_and_how_to_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--params", "7.5B", "--layers", "32", "--hidden", "4096", "--heads",
                 "32", "--seq", "4096", "--vocab", "32000", "--gpus", "64", "--gpu", "H100",
                 "--global-batch", "512", "--steps", "1000", "--price-per-gpu-hour", "2",
                 "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "why:" in text and "torchrun --nnodes=8 --nproc_per_node=8" in text
    d = json.loads(out.read_text())
    ch = d["chosen"]
    assert ch["name"] == d["candidates"][0]["name"]
    mem = ch["memory_per_gpu_bytes"]
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
    assert set(ch["formulas"]) == set(mem) - {"total"}
    assert ch["micro_batch"] * ch["accumulation_steps"] * ch["dp"] == 512
    if ch["zero_stage"]:
        assert ch["deepspeed_config"]["zero_optimization"]["stage"] == ch["zero_stage"]
        assert ch["deepspeed_config"]["train_batch_size"] == 512
    assert ch["projection"]["cost"] == pytest.approx(
        ch["projection"]["job_time_s"] / 3600 * 64 * 2)
    assert d["rejected"] and all(r["why"] for r in d["rejected"])
    assert ch["why"] == d["why"] and all(c["why"] for c in d["candidates"])
    assert all(c["projection"]["steps"] == 1000 for c in d["candidates"])


def test_cli_refuses_two_model_sources_and_counts_a_factory_on_meta(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", str(SCRIPTS / "tune_tiny.py"), "--params", "1e9", "--gpus", "8",
                 "--global-batch", "64"])
    assert code == 2
    assert "give the model one way" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert main(["plan", str(SCRIPTS / "tune_tiny.py"), "--gpus", "2", "--gpus-per-node", "2",
                 "--gpu", "L4", "--global-batch", "64", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["activations"]["source"].startswith("counted on the meta device")
    assert d["model"]["params"] == 16 * 64 + 64 + 2 * 64 + 64 * 4 + 4  # tune_tiny's MLP


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_predicted_model_states_equal_live_bytes_under_ddp_and_fsdp2(tmp_path: Path,
                                                                     ranks: int) -> None:
    for d in run_ranks("plan_states.py", tmp_path, ranks):
        for kind in ("ddp", "fsdp"):
            assert d[kind]["measured"] == pytest.approx(d[kind]["predicted"], rel=0.05), kind
