"""The memory-bandwidth bound of decode at concurrency 1 (gptoss_patch.bench.bound), without a GPU."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from gptoss_patch.bench import bound
from gptoss_patch.errors import UsageError
from gptoss_patch.model import GPT_OSS_20B, GPT_OSS_120B, TINY


def _by_hand(recipe, context: int) -> dict[str, int]:
    """The same bytes from the published shapes, written out (bf16 = 2 bytes, MXFP4 = 17 bytes / 32 values)."""
    h, i, e, k = recipe.hidden_size, recipe.intermediate_size, recipe.num_local_experts, recipe.experts_per_token
    q, kv = recipe.num_attention_heads * recipe.head_dim, recipe.num_key_value_heads * recipe.head_dim
    layers = recipe.num_hidden_layers
    expert_weights = (2 * i * h + h * i) * 17 // 32  # gate_up and down: half a byte a value + a scale byte a block
    expert_biases = (2 * i + h) * 2
    attention = (q * h + q + 2 * (kv * h + kv) + h * q + h + recipe.num_attention_heads) * 2
    other = (2 * h + e * h + e) * 2  # two norms, the router
    sliding = sum(1 for t in recipe.layer_types if t == "sliding_attention")
    kv_tokens = sliding * min(context, recipe.sliding_window) + (layers - sliding) * context
    return {
        "experts": layers * k * (expert_weights + expert_biases),
        "attention": layers * attention,
        "lm_head": recipe.vocab_size * h * 2,
        "other": layers * other + h * 2 + h * 2,  # + the final norm + one embedding row
        "kv_cache": kv_tokens * kv * 2 * 2,
    }


@pytest.mark.parametrize("recipe", [GPT_OSS_20B, GPT_OSS_120B], ids=["20b", "120b"])
def test_the_bytes_a_token_reads_match_the_published_shapes(recipe) -> None:
    found = bound.decode_bytes(recipe, 256)
    assert {
        kind: getattr(found, kind) for kind in ("experts", "attention", "lm_head", "other", "kv_cache")
    } == _by_hand(recipe, 256)
    assert found.total == sum(_by_hand(recipe, 256).values())


def test_20b_reads_about_3_7_gb_a_token_and_the_bound_scales_with_bandwidth() -> None:
    found = bound.decode_bytes(GPT_OSS_20B, 256)
    assert 3.70e9 < found.total < 3.73e9
    limit = bound.Bound(found, bound.Bandwidth(3020.0, "H100"))
    assert limit.ms_per_token == pytest.approx(found.total / 3.020e12 * 1000)
    assert limit.fraction(4.18) == pytest.approx(limit.ms_per_token / 4.18)
    assert limit.to_json()["bytes"]["total"] == found.total


def test_sliding_layers_stop_growing_at_the_window() -> None:
    short, long = bound.decode_bytes(GPT_OSS_20B, 128), bound.decode_bytes(GPT_OSS_20B, 1128)
    per_token_full = 12 * 8 * 64 * 2 * 2  # only the 12 full-attention layers grow past the window
    assert long.kv_cache - short.kv_cache == 1000 * per_token_full
    assert long.total - long.kv_cache == short.total - short.kv_cache


def test_bf16_experts_read_more_than_mxfp4() -> None:
    mxfp4 = bound.decode_bytes(GPT_OSS_20B, 256)
    bf16 = bound.decode_bytes(dataclasses.replace(GPT_OSS_20B, experts="bf16"), 256)
    assert 3.5 < bf16.experts / mxfp4.experts < 3.8 and bf16.attention == mxfp4.attention


def test_the_recipe_comes_back_from_a_written_config(tmp_path: Path) -> None:
    for recipe in (GPT_OSS_20B, TINY):
        (tmp_path / "config.json").write_text(json.dumps(recipe.hf_config()))
        found = bound.recipe_from_model(str(tmp_path))
        assert bound.decode_bytes(found, 300) == bound.decode_bytes(recipe, 300)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "has none"),
        ("{not json", "cannot read"),
        ({"model_type": "llama"}, r"^--bound: .*config.json: model_type .llama. is not gpt-oss"),
        ({"model_type": "gpt_oss", "num_hidden_layers": 2}, "lacks what a gpt-oss config holds"),
    ],
)
def test_a_model_without_a_gpt_oss_config_is_a_usage_error(tmp_path: Path, config, message: str) -> None:
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(UsageError, match=message):
        bound.recipe_from_model(str(tmp_path))


def test_an_interpreter_without_a_cuda_gpu_is_named(tmp_path: Path) -> None:
    # This machine has no GPU: the probe must say so, not report a bandwidth.
    with pytest.raises(
        UsageError, match=r"--bound needs a CUDA GPU in .*: (torch cannot be imported|torch sees no CUDA GPU)"
    ):
        bound.measure_bandwidth(sys.executable)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "2,4"], "add 1 to --concurrency"),
        (["--concurrency", "1"], "has none"),  # a model id, not a local directory
    ],
)
def test_bench_refuses_a_bound_it_cannot_compute_before_anything_starts(tmp_path: Path, args, message: str) -> None:
    from tests.support.cli import run

    result = run("bench", "openai/gpt-oss-20b", "--bound", "--python", sys.executable, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_server_on_two_gpus_is_measured_against_the_bound_of_both(capsys) -> None:
    # Measured (issue 38, 120b, two H200s): TP=2 at 7.56 ms a token read as 15.6 % of one GPU's bound; 7.8 % of both.
    from gptoss_patch import render
    from gptoss_patch.bench.launch import fractions, server_gpus
    from gptoss_patch.bench.stats import BenchReport, Sample, summarize

    limit = bound.Bound(bound.decode_bytes(GPT_OSS_120B, 256), bound.Bandwidth(4000.0, "H200"))
    samples = [Sample(name, 1, 0, 1.0, 1.0, 1.0, 7.56, 1, 0) for name in ("tp2", "tp1")]
    servers = [{"name": "tp2", "gpus": 2}, {"name": "tp1", "gpus": 1}]
    report = BenchReport(servers, {}, summarize(samples, ["tp2", "tp1"]), samples, [], 0.0)
    found = fractions(report, limit)
    assert found["tp2"] == pytest.approx(found["tp1"] / 2, abs=1e-4)
    assert found["tp1"] == pytest.approx(limit.ms_per_token / 7.56, abs=1e-4)
    render.bench_bound(limit, found, server_gpus(report))
    err = capsys.readouterr().err
    assert "GB/s per GPU" in err and f"tp2: decode at concurrency 1 runs at {found['tp2']:.0%} of the bound of its 2 GPUs" in err
