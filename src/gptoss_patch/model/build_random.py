"""Build a randomly initialised gpt-oss checkpoint with the o200k_harmony tokenizer (run in the target venv).

Run by gptoss_patch.model.build() with the interpreter of a venv that has torch, transformers (with
tiktoken, which its TikTokenConverter reads the vocabulary with) and safetensors. It reads one JSON
object, on stdin or as the file named by argv[1]:

    {"recipe": {...Recipe fields...}, "config": {...config.json...},
     "vocab_file": "/path/o200k_base.tiktoken", "out": "/empty/directory",
     "shards": [[{"name", "shape", "dtype", "init"}, ...], ...], "mxfp4_scale_bytes": [low, high],
     "weights": true}

and writes config.json, model.safetensors
(or model-0000N-of-0000M.safetensors and their index), generation_config.json and the tokenizer
files into "out"; with "weights": false everything but the safetensors and their index (a directory
for vLLM's --load-format dummy, written in seconds whatever the shape). On success it prints one JSON line
(what it wrote, parameter count, bytes, device, seconds). Everything is local: nothing here may reach a
model hub. Standard library plus torch/transformers/safetensors only, because it runs in an interpreter
gptoss-patch knows nothing else about.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path

ANSWER = "GPTOSS_PATCH_ANSWER "  # gptoss_patch.target.ANSWER (this script runs where gptoss-patch may not be installed)

# tiktoken caches every file it reads, local ones included, under $TMPDIR/data-gym-cache unless
# this is empty; the build must write nowhere but its output directory.
os.environ["TIKTOKEN_CACHE_DIR"] = ""

# o200k_base's pre-tokenizer regex (tiktoken's openai_public.py); o200k_harmony uses it unchanged.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# o200k_harmony's special tokens: the named ones; every other id from FIRST_SPECIAL to LAST_SPECIAL
# is <|reserved_ID|>. They follow the 199998 ranks of o200k_base without a gap.
FIRST_SPECIAL, LAST_SPECIAL = 199998, 201087
NAMED_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}

# Not harmony: a small template of our own, so that vLLM finds one (without it, it logs an ERROR at
# start-up and /tokenize with messages answers 400). Chat Completions on gpt-oss render harmony in
# vLLM itself and never use it. Content is read only as a string so vLLM passes text parts flattened.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|start|>{{ message['role'] }}<|message|>{{ message['content'] or '' }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)

# As the published checkpoints: stop on <|return|>, <|endoftext|> and <|call|>.
STOP_TOKEN_IDS = [200002, 199999, 200012]


def main(argv: list[str]) -> int:
    payload = read_payload(argv)
    out, recipe, config = Path(payload["out"]), payload["recipe"], payload["config"]
    started = time.monotonic()
    write_tokenizer(Path(payload["vocab_file"]), out, config)
    tokenizer_seconds = time.monotonic() - started
    if payload.get("weights", True):
        parameters, size, device = write_model(recipe, out, payload["shards"], payload["mxfp4_scale_bytes"])
    else:
        parameters, size, device = 0, 0, None
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(config))
    summary = {
        "out": str(out),
        "files": sorted(path.name for path in out.iterdir()),
        "parameters": parameters,
        "bytes": size,
        "device": device,
        "tokenizer_seconds": round(tokenizer_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(ANSWER + json.dumps(summary), flush=True)  # the framing gptoss_patch.target.call reads
    return 0


def read_payload(argv: list[str]) -> dict:
    text = Path(argv[1]).read_text(encoding="utf-8") if len(argv) > 1 else sys.stdin.read()
    return json.loads(text)


# --- tokenizer ------------------------------------------------------------------------------------


def special_tokens() -> list[str]:
    """All special tokens in id order (the converter numbers them from the end of the vocabulary)."""
    return [NAMED_SPECIALS.get(token_id, f"<|reserved_{token_id}|>") for token_id in range(FIRST_SPECIAL, LAST_SPECIAL + 1)]


def write_tokenizer(vocab_file: Path, out: Path, config: dict) -> None:
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # transformers 4.x calls the argument additional_special_tokens, 5.x extra_special_tokens.
    parameters = inspect.signature(TikTokenConverter.__init__).parameters
    keyword = "extra_special_tokens" if "extra_special_tokens" in parameters else "additional_special_tokens"
    converter = TikTokenConverter(vocab_file=str(vocab_file), pattern=O200K_PATTERN, **{keyword: special_tokens()})
    backend = converter.converted()
    check_special_ids(backend)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=NAMED_SPECIALS[config["bos_token_id"]],
        eos_token=NAMED_SPECIALS[config["eos_token_id"]],
        pad_token=NAMED_SPECIALS[config["pad_token_id"]],
        model_max_length=config["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )
    # The template goes into tokenizer_config.json, which every reader of chat templates knows;
    # chat_template.jinja is newer than some of them.
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
    portable_tokenizer_config(out / "tokenizer_config.json")


def portable_tokenizer_config(path: Path) -> None:
    """Name the class as the released checkpoints do: transformers 5 writes its own TokenizersBackend,
    which 4.x cannot load; both load PreTrainedTokenizerFast."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_special_ids(backend) -> None:
    """Fail the build, not a later test, if a special token did not land on harmony's id."""
    for token_id, token in zip(range(FIRST_SPECIAL, LAST_SPECIAL + 1), special_tokens()):
        found = backend.token_to_id(token)
        if found != token_id:
            raise SystemExit(f"tokenizer: {token} got id {found}, harmony has {token_id}")
    if backend.get_vocab_size(with_added_tokens=True) != LAST_SPECIAL + 1:
        raise SystemExit(f"tokenizer: {backend.get_vocab_size(with_added_tokens=True)} tokens, expected {LAST_SPECIAL + 1}")


# --- model ----------------------------------------------------------------------------------------


def write_model(recipe: dict, out: Path, shards: list, scale_bytes: list) -> tuple[int, int, str]:
    """Random weights from a seeded generator, one safetensors file per shard of the plan.

    Returns (parameters, bytes, device). Tensors are made on the GPU when torch sees one (a 20b
    checkpoint takes seconds there, minutes on a CPU), one shard at a time, so memory stays at about
    one shard whatever the shape.
    """
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    files = ["model.safetensors"] if len(shards) == 1 else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    low, high = scale_bytes
    parameters = total = 0
    weight_map: dict[str, str] = {}
    for index, (file_name, shard) in enumerate(zip(files, shards)):
        generator = torch.Generator(device=device).manual_seed(recipe["seed"] * 1_000_003 + index)
        tensors = {}
        for spec in shard:
            tensors[spec["name"]] = make_tensor(torch, spec, generator, device, low, high).cpu()
            weight_map[spec["name"]] = file_name
        # transformers refuses a safetensors file without format "pt" in its metadata.
        save_file(tensors, str(out / file_name), metadata={"format": "pt"})
        parameters += sum(t.numel() for t in tensors.values())
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if len(files) > 1:
        write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return parameters, total, device


def make_tensor(torch, spec: dict, generator, device: str, low: int, high: int):
    shape = tuple(spec["shape"])
    if spec["init"] == "ones":
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    if spec["init"] == "normal":
        values = torch.randn(shape, generator=generator, dtype=torch.float32, device=device) * 0.02
        return values.to(torch.bfloat16)
    if spec["init"] == "nibbles":  # two e2m1 values a byte: every byte is a valid pair
        return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8, device=device)
    if spec["init"] == "scales":  # e8m0 exponents: 2^(byte - 127)
        return torch.randint(low, high + 1, shape, generator=generator, dtype=torch.uint8, device=device)
    raise SystemExit(f"unknown init {spec['init']!r} for {spec['name']}")


def generation_config(config: dict) -> dict:
    return {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": STOP_TOKEN_IDS,
        "pad_token_id": config["pad_token_id"],
        "do_sample": True,
        "transformers_version": config["transformers_version"],
    }


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
