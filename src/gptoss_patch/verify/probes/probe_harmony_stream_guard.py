"""Probe for harmony_stream_guard: a malformed token in a gpt-oss stream must not abort it (G05).

The stream below has a stray `<|return|>` where the parser expects `<|start|>` (the HarmonyError
users see: "Unexpected token 200002 while expecting start token 200006"). It is fed token by token
through the per-token step the installed stream loop uses: the patched helper where the patch put it,
else the bare `parser.process`, as stock vLLM before 0.32.0 does. Needs the harmony vocabulary.
"""

import importlib

from _builder import NoBuilder
from _common import vllm_version

REQUIRES = ("vllm", "openai_harmony")
HELPER = "_gptoss_patch_harmony_process"
MODULES = ("vllm.entrypoints.openai.chat_completion.serving", "vllm.parser.harmony")  # <= 0.23, 0.24-0.31
STREAM = "<|channel|>final<|message|>Hello<|end|><|return|><|start|>assistant<|channel|>final<|message|> world<|end|>"


def run(verbose):
    from openai_harmony import HarmonyEncodingName, HarmonyError, Role, StreamableParser, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tokens = encoding.encode(STREAM, allowed_special="all")
    parser = StreamableParser(encoding, role=Role.ASSISTANT)
    step, where = _installed_step(parser)
    skipped = []
    try:
        for token in tokens:
            if step(token) is False:
                skipped.append(token)
    except HarmonyError as exc:
        return {"passed": False, "evidence": f"the stream aborted at a malformed token ({where}): {exc}"}
    texts = [part.text for message in parser.messages for part in message.content]
    detail = f"messages: {texts!r}; skipped tokens: {skipped}" if verbose else ""
    if texts != ["Hello", " world"] or len(skipped) != 1:
        return {"passed": False, "evidence": f"unexpected result ({where}): messages {texts!r}, skipped {skipped}"}
    return {"passed": True, "evidence": f"{where}: skipped token {skipped[0]}, the stream went on: {texts!r}", "detail": detail}


def _installed_step(parser):
    """The per-token step of the installed stream loop, and where it came from."""
    version = tuple(int(part) for part in vllm_version().split(".")[:2])
    name = MODULES[0] if version < (0, 24) else MODULES[1]
    module = importlib.import_module(name)  # a missing dependency is reported as such by run.py
    helper = getattr(module, HELPER, None)
    if helper is not None:
        return (lambda token: helper(parser, token)), f"{name}.{HELPER}"
    if version >= (0, 24):
        raise NoBuilder("vLLM 0.24+ streams through HarmonyParser.process_chunk, which needs a tokenizer to build; "
                        "use `gptoss-patch status` for its state")
    return parser.process, "the unguarded parser.process(token_id) of the installed stream generator"
