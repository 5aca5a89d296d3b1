"""model/shape.py, the one reader of a model's shape: a local config.json or a released id, into a Recipe, and the
commands that read it (pre-flight's memory estimate, numerics' kernel layer, bench --bound) seeing the same shape."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gptoss_patch.bench import bound
from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import parallel
from gptoss_patch.model import GPT_OSS_20B, GPT_OSS_120B, TINY, shape as shapes
from gptoss_patch.numerics import kernels


def checkpoint(directory: Path, config: dict) -> str:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openai/gpt-oss-120b", GPT_OSS_120B), ("openai/gpt-oss-20b", GPT_OSS_20B), ("gpt-oss-20b-mxfp4", GPT_OSS_20B),
        ("/models/my-gpt-oss-120b/", GPT_OSS_120B),
    ],
)  # fmt: skip
def test_a_released_name_gets_the_published_shape(model, expected):
    found = shapes.read(model)
    assert found is not None and found.recipe == expected and found.config is None


@pytest.mark.parametrize("model", [None, "", "some/model", "openai/gpt-oss-safeguard"])
def test_anything_else_has_no_shape(model):
    assert shapes.read(model) is None


@pytest.mark.parametrize("recipe", [TINY, GPT_OSS_20B, GPT_OSS_120B])
def test_a_config_json_reads_back_as_the_recipe_that_wrote_it(tmp_path, recipe):
    found = shapes.read(checkpoint(tmp_path / "m", recipe.hf_config()))
    assert found is not None and found.config == tmp_path / "m" / "config.json"
    assert found.recipe == dataclasses.replace(
        recipe, name="m", initial_context_length=found.recipe.initial_context_length, rope_theta=found.recipe.rope_theta
    )


def test_what_a_config_may_leave_out_takes_gpt_osss_value(tmp_path):
    keys = {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    found = shapes.read(checkpoint(tmp_path / "m", keys))
    assert found is not None
    recipe = found.recipe
    assert recipe.layer_types == ("sliding_attention", "full_attention") * 2 and recipe.sliding_window == 128
    assert (recipe.head_dim, recipe.vocab_size, recipe.max_position_embeddings, recipe.swiglu_limit) == (64, 201088, 131072, 7.0)
    assert recipe.experts == "bf16"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", r"^cannot read .*config\.json: "),
        ("[]", r"config\.json is not a JSON object$"),
        ({"model_type": "llama"}, r"config\.json: model_type 'llama' is not gpt-oss \(gpt_oss\)$"),
        ({"model_type": "gpt_oss", "num_hidden_layers": 2}, r"config\.json lacks what a gpt-oss config holds: hidden_size, "),
        ({**GPT_OSS_20B.hf_config(), "hidden_size": "wide"}, r"config\.json: a value is not what a gpt-oss config holds"),
    ],
)
def test_a_config_that_is_not_readable_gpt_oss_is_one_line_naming_the_file(tmp_path, config, message):
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(UsageError, match=message):
        shapes.read(str(tmp_path))


def test_pre_flight_numerics_and_the_bound_see_one_shape(tmp_path):
    # Was: three readers with their own defaults (a config without head_dim was hidden / heads = 45 to pre-flight's
    # memory estimate for the 20b, an error to --bound; gpt-oss's is 64) and their own recognition of released names.
    keys = {key: value for key, value in GPT_OSS_20B.hf_config().items() if key not in ("sliding_window", "head_dim", "layer_types")}
    model = checkpoint(tmp_path / "20b-like", keys)
    preflight_shape = parallel.model_shape(model)
    layer = kernels.layer_shape(model, None)
    recipe = bound.recipe_from_model(model)
    assert preflight_shape is not None
    assert (preflight_shape.layers, preflight_shape.experts, preflight_shape.head_dim, preflight_shape.sliding_window) == (
        recipe.num_hidden_layers, recipe.num_local_experts, recipe.head_dim, recipe.sliding_window)
    assert layer.shape["head_dim"] == recipe.head_dim == GPT_OSS_20B.head_dim
    assert layer.shape["num_local_experts"] == recipe.num_local_experts and layer.experts == recipe.experts
