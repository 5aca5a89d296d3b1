"""Build a randomly initialised gpt-oss checkpoint with the o200k_harmony tokenizer (run in the target venv).

Run by gptoss_patch.model.build() with the interpreter of a venv that has torch, transformers (with
tiktoken, which its TikTokenConverter reads the vocabulary with) and safetensors. It reads one JSON
object, on stdin or as the file named by argv[1]:

    {"recipe": {...Recipe fields...}, "config": {...config.json...},
     "vocab_file": "/path/o200k_base.tiktoken", "out": "/empty/directory"}

and writes config.json, model.safetensors, generation_config.json and the tokenizer files into
"out"; on success it prints one JSON line (what it wrote, parameter count, seconds). Everything is
local: nothing here may reach a model hub. Standard library plus torch/transformers/safetensors only,
because it runs in an interpreter gptoss-patch knows nothing else about.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

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
    parameters = write_model(config, recipe, out)
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation_config(config))
    summary = {
        "out": str(out),
        "files": sorted(path.name for path in out.iterdir()),
        "parameters": parameters,
        "tokenizer_seconds": round(tokenizer_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary))
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

    converter = TikTokenConverter(vocab_file=str(vocab_file), pattern=O200K_PATTERN, additional_special_tokens=special_tokens())
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


def check_special_ids(backend) -> None:
    """Fail the build, not a later test, if a special token did not land on harmony's id."""
    for token_id, token in zip(range(FIRST_SPECIAL, LAST_SPECIAL + 1), special_tokens()):
        found = backend.token_to_id(token)
        if found != token_id:
            raise SystemExit(f"tokenizer: {token} got id {found}, harmony has {token_id}")
    if backend.get_vocab_size(with_added_tokens=True) != LAST_SPECIAL + 1:
        raise SystemExit(f"tokenizer: {backend.get_vocab_size(with_added_tokens=True)} tokens, expected {LAST_SPECIAL + 1}")


# --- model ----------------------------------------------------------------------------------------


def write_model(config: dict, recipe: dict, out: Path) -> int:
    """Random weights from a seeded generator, saved as safetensors; returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    # config.json keys that are not constructor arguments of the config class.
    settings = {key: value for key, value in config.items() if key not in ("model_type", "transformers_version", "torch_dtype")}
    torch.manual_seed(recipe["seed"])
    model = GptOssForCausalLM(GptOssConfig(**settings))
    model = model.to(getattr(torch, recipe["dtype"]))
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    # transformers refuses a safetensors file without format "pt" in its metadata.
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(tensor.numel() for tensor in state.values())


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
