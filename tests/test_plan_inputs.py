"""`redline plan` refuses to guess: every input finite, consistent and within stated limits,
the sequence length required where it is not known, encoder–decoder configs counted as the
models built from them count, a search bounded in size, and the library's messages in field
words that the CLI turns into flags."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from redline.cli.main import main
from redline.plan import (
    PlanInputError,
    Training,
    cluster,
    from_config_json,
    from_numbers,
    search,
)
from redline.plan.limits import MAX_GPUS, MAX_LAYOUTS

LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008,
            "hidden_act": "silu", "max_position_embeddings": 4096}


def _config(tmp_path: Path, name: str = "config.json", **change: Any) -> Path:
    cfg = {k: v for k, v in {**LLAMA_7B, **change}.items() if v is not None}
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the sequence length -------------------------------------------------------------------

def test_a_config_without_a_sequence_length_is_refused_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _config(tmp_path, max_position_embeddings=None)
    with pytest.raises(PlanInputError, match=r"max_position_embeddings.*give `seq`"):
        from_config_json(p)
    assert from_config_json(p, seq=2048).seq == 2048
    code, out, err = _plan(capsys, "--config", str(p), "--gpus", "8", "--global-batch", "64")
    assert code == 2 and out == ""
    assert "max_position_embeddings" in err and "--seq" in err and "`" not in err
    assert _plan(capsys, "--config", str(p), "--seq", "2048", "--gpus", "8",
                 "--global-batch", "64")[0] == 0


def test_a_shape_without_a_sequence_length_is_not_planned_as_one_token(
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = from_numbers(params=6.7e9, layers=32, hidden=4096, heads=32, vocab=32000)
    with pytest.raises(PlanInputError, match=r"sequence length .*`seq`"):
        search(spec, Training(global_batch=64), cluster(8, "H100"))
    code, _, err = _plan(capsys, "--params", "6.7B", "--layers", "32", "--hidden", "4096",
                         "--heads", "32", "--vocab", "32000", "--gpus", "8",
                         "--global-batch", "64")
    assert code == 2 and "--seq" in err


def test_a_sequence_longer_than_learned_positions_is_refused(tmp_path: Path) -> None:
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
                                "n_head": 12, "vocab_size": 50257, "n_positions": 1024}))
    with pytest.raises(PlanInputError,
                       match=r"`seq` 4,096 is longer than the model's 1,024 learned positions"):
        from_config_json(gpt2, seq=4096)
    # Rotary positions have no table: a longer sequence is the user's choice.
    assert from_config_json(_config(tmp_path), seq=16384).seq == 16384


# -- parameters counted as the model built from the config counts them ----------------------

def _families() -> dict[str, tuple[Any, Any]]:
    import transformers as tf

    return {
        "t5-small": (tf.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048,
                                 num_layers=6, num_heads=8),
                     tf.T5ForConditionalGeneration),
        # T5 v1.1 style: gated-GELU MLP, untied output, fewer decoder than encoder layers,
        # d_kv × heads ≠ d_model.
        "t5-v1.1-gated-untied": (tf.T5Config(vocab_size=32128, d_model=512, d_kv=64,
                                             d_ff=1024, num_layers=8, num_decoder_layers=4,
                                             num_heads=6, feed_forward_proj="gated-gelu",
                                             tie_word_embeddings=False),
                                 tf.T5ForConditionalGeneration),
        "bart": (tf.BartConfig(vocab_size=50265, d_model=768, encoder_layers=6,
                               decoder_layers=6, encoder_attention_heads=12,
                               decoder_attention_heads=12, encoder_ffn_dim=3072,
                               decoder_ffn_dim=3072, max_position_embeddings=1024),
                 tf.BartForConditionalGeneration),
        "gpt-neox": (tf.GPTNeoXConfig(vocab_size=50304, hidden_size=1024, num_hidden_layers=8,
                                      num_attention_heads=16, intermediate_size=4096,
                                      max_position_embeddings=2048),
                     tf.GPTNeoXForCausalLM),
        "llama-gqa": (tf.LlamaConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=8,
                                     num_attention_heads=16, num_key_value_heads=4,
                                     intermediate_size=2816, max_position_embeddings=4096),
                      tf.LlamaForCausalLM),
        # A head width stated apart from hidden ÷ heads, one key/value head, tied, gated GELU.
        "gemma-head-dim": (tf.GemmaConfig(vocab_size=32000, hidden_size=1024,
                                          num_hidden_layers=4, num_attention_heads=8,
                                          num_key_value_heads=1, head_dim=256,
                                          intermediate_size=8192), tf.GemmaForCausalLM),
        # Learned positions with OPT's offset of two rows, biases everywhere.
        "opt": (tf.OPTConfig(hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
                             num_attention_heads=12), tf.OPTForCausalLM),
    }


@pytest.mark.parametrize("family", ["t5-small", "t5-v1.1-gated-untied", "bart", "gpt-neox",
                                    "llama-gqa", "gemma-head-dim", "opt"])
def test_config_parameter_count_matches_the_model_built_from_it(tmp_path: Path,
                                                                family: str) -> None:
    import torch

    cfg, cls = _families()[family]
    with torch.device("meta"):
        model = cls(cfg)
    real = sum(p.numel() for p in model.parameters())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    spec = from_config_json(path, seq=512)
    assert spec.params == pytest.approx(real, rel=0.01), (spec.params, real)
    if family.startswith("t5"):
        assert spec.layers == cfg.num_layers + cfg.num_decoder_layers
        assert spec.hidden == 512


# -- consistency ------------------------------------------------------------------------------

def test_a_parameter_count_that_contradicts_the_shape_is_refused_with_both_numbers(
        capsys: pytest.CaptureFixture[str]) -> None:
    shape = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq": 2048}
    with pytest.raises(PlanInputError) as e:
        from_numbers(params=1e9, **shape)
    msg = str(e.value)
    assert "1,000,000,000" in msg and "`params`" in msg and "--" not in msg
    counted = from_numbers(**shape).params  # the shape's own count (GPT formula)
    assert f"{counted:,}" in msg
    assert from_numbers(params=6.7e9, **shape).params == 6_700_000_000
    code, _, err = _plan(capsys, "--params", "1B", "--layers", "32", "--hidden", "4096",
                         "--heads", "32", "--vocab", "32000", "--seq", "2048", "--gpus", "8",
                         "--global-batch", "64")
    assert code == 2 and "--params" in err and "1,000,000,000" in err


@pytest.mark.parametrize(("change", "words"), [
    ({"num_key_value_heads": 5}, r"num_key_value_heads 5 does not divide num_attention_heads "
                                 r"32"),
    ({"num_key_value_heads": 0}, r"num_key_value_heads is 0"),
    ({"num_key_value_heads": 64}, r"num_key_value_heads 64 does not divide"),
    ({"num_attention_heads": 0}, r"num_attention_heads is 0"),
    ({"num_attention_heads": 33}, r"hidden size 4096 .* 33 heads"),
    ({"hidden_size": True}, r"hidden_size is True"),
    ({"hidden_size": 4096.5}, r"hidden_size is 4096.5"),
    ({"vocab_size": -5}, r"vocab_size is -5"),
    ({"hidden_size": math.nan}, r"hidden_size is nan"),
    ({"hidden_size": "4096"}, r"hidden_size is '4096'"),
    ({"num_local_experts": 8}, r"mixture of experts \(num_local_experts 8\)"),
    ({"num_hidden_layers": 10**9}, r"num_hidden_layers is 1,000,000,000, expected a whole "
                                   r"number from 1 to 100,000"),
])
def test_config_values_are_checked_not_trusted(tmp_path: Path, change: dict[str, Any],
                                               words: str) -> None:
    with pytest.raises(PlanInputError, match=words):
        from_config_json(_config(tmp_path, **change))


def test_heads_zero_from_the_library_is_a_message_in_field_words() -> None:
    with pytest.raises(PlanInputError, match=r"`heads`.*got 0") as e:
        from_numbers(params=1e9, hidden=1024, heads=0)
    assert "--" not in str(e.value)


# -- finite, positive, within physical limits ---------------------------------------------------

@pytest.mark.parametrize(("call", "field"), [
    (lambda: cluster(8, "H100", peak_tflops=math.inf), "peak_tflops"),
    (lambda: cluster(8, "H100", peak_tflops=5e6), "peak_tflops"),
    (lambda: cluster(8, "H100", peak_tflops=math.nan), "peak_tflops"),
    (lambda: cluster(8, "H100", memory_gb=math.inf), "memory_gb"),
    (lambda: cluster(8, "H100", memory_gb=1e6), "memory_gb"),
    (lambda: cluster(8, "H100", intra_node_gbps=math.nan), "intra_node_gbps"),
    (lambda: cluster(8, "H100", inter_node_gbps=1e9), "inter_node_gbps"),
    (lambda: cluster(8, "H100", price_per_gpu_hour=math.inf), "price_per_gpu_hour"),
    (lambda: cluster(8, "H100", gpus_per_node=100_000), "gpus_per_node"),
    (lambda: cluster(8, "H100", peak_tflops=1e-300), "peak_tflops"),
    (lambda: cluster(8, "H100", memory_gb=1e-300), "memory_gb"),
    (lambda: cluster(8, "H100", inter_node_gbps=1e-300), "inter_node_gbps"),
    (lambda: from_numbers(params=math.inf), "params"),
    (lambda: from_numbers(params=math.nan), "params"),
    (lambda: from_numbers(params=1e20), "params"),
    (lambda: from_numbers(params=1e9, seq=10**10), "seq"),
    (lambda: Training(global_batch=10**12, seq=2048), "global_batch"),
    (lambda: search(from_numbers(params=1e9, seq=512), Training(global_batch=8, seq=512), cluster(8, "H100"),
                    mfu=math.nan), "mfu"),
    (lambda: search(from_numbers(params=1e9, seq=512), Training(global_batch=8, seq=512), cluster(8, "H100"),
                    mfu=1e-300), "mfu"),
])
def test_every_numeric_input_is_finite_positive_and_within_its_limit(call: Any,
                                                                     field: str) -> None:
    with pytest.raises(PlanInputError, match=rf"`{field}`") as e:
        call()
    assert "--" not in str(e.value)


@pytest.mark.parametrize("argv", [
    ["--params", "inf"], ["--params", "nan"], ["--params", "1e30"],
    ["--params", "7B", "--peak-tflops", "inf"], ["--params", "7B", "--steps", "inf"],
    ["--params", "7B", "--gpu-memory-gb", "1e12"], ["--params", "7B", "--mfu", "inf"],
])
def test_cli_non_finite_or_impossible_numbers_are_one_line_not_a_traceback(
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    try:
        code = main(["plan", *argv, "--seq", "2048", "--gpus", "8", "--global-batch", "64"])
    except SystemExit as e:  # argparse's own refusal of a value it cannot parse
        code = e.code  # type: ignore[assignment]
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    flag = argv[-2]
    assert f"{flag}" in out.err and ("finite" in out.err or "at most" in out.err), out.err


def test_cli_inf_peak_gives_no_infinity_in_the_json(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as e:
        main(["plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
              "--vocab", "32000", "--seq", "2048", "--gpus", "8", "--global-batch", "64",
              "--peak-tflops", "inf", "--json", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--peak-tflops" in err and "finite" in err
    assert not out.exists()
    # A peak past the stated limit is refused by the library, in the command's words.
    code, _, err = _plan(capsys, "--params", "7B", "--seq", "2048", "--gpus", "8",
                         "--global-batch", "64", "--peak-tflops", "1e9", "--json", str(out))
    assert code == 2 and "--peak-tflops" in err and "at most 100,000" in err
    assert not out.exists()


# -- a bounded search ---------------------------------------------------------------------------

def test_a_billion_gpus_is_refused_at_once_naming_the_limit(
        capsys: pytest.CaptureFixture[str]) -> None:
    t = time.perf_counter()
    with pytest.raises(PlanInputError, match=rf"`gpus`.*at most {MAX_GPUS:,}"):
        cluster(1_000_000_000, "H100")
    code, _, err = _plan(capsys, "--params", "7B", "--seq", "2048", "--gpus", "1000000000",
                         "--global-batch", "1000000000")
    assert code == 2 and "--gpus" in err and f"{MAX_GPUS:,}" in err
    assert time.perf_counter() - t < 5  # it used to enumerate for minutes


def test_the_search_evaluates_a_bounded_number_of_layouts_and_says_so() -> None:
    """720,720 GPUs and 7,560 layers (both highly composite: hundreds of degrees divide them)
    enumerate 63,000 layouts unbounded; the search keeps to MAX_LAYOUTS and says what it
    thinned."""
    spec = from_numbers(layers=7560, hidden=12288, heads=96, vocab=51200, seq=2048)
    t = time.perf_counter()
    res = search(spec, Training(global_batch=720720 * 4, seq=2048), cluster(720720, "H100"))
    took = time.perf_counter() - t
    assert 0 < res.evaluated <= MAX_LAYOUTS
    assert res.thinned and "micro-batch" in res.thinned
    assert took < 3.0  # generous: the bound is on layouts, this machine is shared
    # An ordinary search is whole and says nothing of thinning.
    small = search(from_numbers(layers=32, hidden=4096, heads=32, vocab=32000, seq=2048),
                   Training(global_batch=64, seq=2048), cluster(8, "H100"))
    assert small.thinned is None and small.evaluated == 716


# -- the config path -------------------------------------------------------------------------

def test_config_on_a_folder_reads_its_config_json_or_says_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _config(tmp_path)
    assert from_config_json(tmp_path).params == from_config_json(tmp_path / "config.json").params
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PlanInputError, match=r"folder .* has no config\.json"):
        from_config_json(empty)
    code, _, err = _plan(capsys, "--config", str(empty), "--gpus", "8", "--global-batch", "8")
    assert code == 2 and "--config" in err and "no config.json" in err


def test_library_messages_speak_in_fields_and_the_cli_in_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PlanInputError) as e:
        cluster(12, "H100")
    assert "`gpus` 12 is not a whole number of nodes of `gpus_per_node` 8" in str(e.value)
    code, _, err = _plan(capsys, "--params", "7B", "--seq", "2048", "--gpus", "12",
                         "--global-batch", "12")
    assert code == 2 and "--gpus 12 is not a whole number of nodes of --gpus-per-node 8" in err


# -- the second hostile pass -----------------------------------------------------------------

def test_json_output_naming_the_config_is_refused_before_it_is_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _config(tmp_path)
    before = p.read_bytes()
    code, out, err = _plan(capsys, "--config", str(p), "--gpus", "8", "--global-batch", "64",
                           "--json", str(p))
    assert code == 2 and out == "" and "is the config" in err
    assert p.read_bytes() == before
    code, out, err = _plan(capsys, "--config", str(tmp_path), "--gpus", "8",
                           "--global-batch", "64", "--json", str(p))
    assert code == 2 and "is the config" in err and p.read_bytes() == before


def test_json_output_on_a_folder_is_refused_before_planning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _plan(capsys, "--params", "7B", "--seq", "2048", "--gpus", "8",
                           "--global-batch", "64", "--json", str(tmp_path))
    assert code == 2 and out == "" and "existing directory" in err


def test_config_edge_cases_read_or_explained(tmp_path: Path) -> None:
    bom = tmp_path / "bom.json"
    bom.write_text(json.dumps(LLAMA_7B), encoding="utf-8-sig")  # as some editors save it
    assert from_config_json(bom).params == from_config_json(_config(tmp_path)).params
    nested = tmp_path / "llava.json"
    nested.write_text(json.dumps({"model_type": "llava", "text_config": LLAMA_7B}))
    with pytest.raises(PlanInputError, match=r"under text_config: give that object"):
        from_config_json(nested)
    with pytest.raises(PlanInputError, match=r"`path` must be the path of a config\.json"):
        from_config_json(LLAMA_7B)  # type: ignore[arg-type]


def test_tensor_parallelism_divides_the_key_value_heads(tmp_path: Path) -> None:
    """Megatron-LM requires the query groups (key/value heads) divisible by the TP degree."""
    spec = from_config_json(_config(tmp_path, num_key_value_heads=2))
    assert spec.kv_heads == 2
    res = search(spec, Training(global_batch=64, seq=4096), cluster(8, "H100"))
    assert {c.layout.tp for c in res.ranked} <= {1, 2}


@pytest.mark.parametrize(("call", "words"), [
    (lambda: from_numbers(params=True), r"`params` .* got True"),
    (lambda: cluster(8.5, "H100"), r"`gpus` .* got 8\.5"),  # type: ignore[arg-type]
    (lambda: search(from_numbers(params=1e9, seq=512), Training(global_batch=8, seq=512), cluster(8, "H100"),
                    headroom=1.0), r"`headroom` .* got 1\.0"),
])
def test_api_values_of_the_wrong_kind_are_refused(call: Any, words: str) -> None:
    with pytest.raises(PlanInputError, match=words):
        call()


def test_every_field_the_library_names_has_its_flag_or_none_by_design() -> None:
    """The CLI's field → flag table names real options, and covers every limited field but
    the three only a config or a model gives."""
    import argparse

    from redline.cli import plan as cli_plan
    from redline.plan.limits import LIMITS

    parser = argparse.ArgumentParser()
    cli_plan.add_parser(parser.add_subparsers())
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = {o for a in sub.choices["plan"]._actions for o in a.option_strings}
    assert set(cli_plan.FLAGS.values()) <= options
    assert set(LIMITS) - set(cli_plan.FLAGS) == {"largest_layer_params", "kv_heads",
                                                 "head_dim"}
    assert cli_plan.plan_words("`gpus_per_node` 8, `kv_heads` 2") == "--gpus-per-node 8, kv_heads 2"
