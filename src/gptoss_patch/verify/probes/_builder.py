"""Build gpt-oss Chat Completions and Responses prompts through the installed `_make_request_with_harmony`, no engine.

The chat method reads only `supports_browsing` and `supports_code_interpreter` from `self` (0.15.1-0.23.0),
so an instance made with `object.__new__` plus those two attributes is enough (docs/development.md, "The CPU harness").
The Responses one (OpenAIServingResponses, 0.15.1-0.29.x) reads `tool_server` (None: no built-in tools)
and, for a continuation only, `msg_store`; ResponsesBuilder renders new conversations.
"""

import importlib
import importlib.util
import os
import re

METHOD = "_make_request_with_harmony"
# Where the Chat Completions harmony builder lives, newest first (docs/vllm-layouts.md#the-chat-completions-harmony-builder).
LOCATIONS = (
    ("entrypoints/serve/render/serving.py", "vllm.entrypoints.serve.render.serving", "OpenAIServingRender"),
    ("entrypoints/openai/chat_completion/serving.py", "vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat"),
)
# The Responses harmony builder (0.15.1-0.29.x; 0.30.0 renders through renderers/online_renderer.py).
RESPONSES_LOCATION = ("entrypoints/openai/responses/serving.py", "vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses")
SECTION = re.compile(r"<\|start\|>(.*?)<\|message\|>(.*?)<\|end\|>", re.S)


class NoBuilder(Exception):
    """This vLLM keeps the harmony request builder somewhere this probe does not know."""


def locate():
    """(module, class) of the installed builder, found by reading files, so nothing is imported yet."""
    _relpath, module, cls = first_defining(LOCATIONS, METHOD)
    return module, cls


def first_defining(candidates, function=None):
    """The first (file under vllm/, module, name) of `candidates` whose file defines `function` (else its own name),
    read without importing vLLM; NoBuilder when none does."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    root = list(spec.submodule_search_locations)[0]
    for candidate in candidates:
        path = os.path.join(root, candidate[0])
        if os.path.isfile(path) and f"def {function or candidate[2]}(" in _read(path):
            return candidate
    raise NoBuilder("no {} in {}".format(function or "/".join(c[2] for c in candidates), ", ".join(c[0] for c in candidates)))


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


class Builder:
    def __init__(self):
        module_name, class_name = locate()
        module = importlib.import_module(module_name)
        self.where = f"{module_name}.{class_name}.{METHOD}"
        self.request_class = module.ChatCompletionRequest  # the serving module imports it by name
        self.server = object.__new__(getattr(module, class_name))
        self.server.supports_browsing = False
        self.server.supports_code_interpreter = False
        self._hu = importlib.import_module("vllm.entrypoints.openai.parser.harmony_utils")

    def request(self, case):
        fields = dict(case)
        fields.setdefault("model", "gpt-oss-20b")
        return self.request_class(**fields)

    def build(self, request):
        """Prompt token ids, as the server's caller computes them (tools included iff given)."""
        _, prompts = self.server._make_request_with_harmony(request, request.tools is not None)
        prompt = prompts[0]
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt.prompt_token_ids
        return list(ids)

    def decode(self, ids):
        return self._hu.get_encoding().decode_utf8(ids)


class ResponsesBuilder(Builder):
    """The same interface for `/v1/responses` requests (fields of ResponsesRequest)."""

    def __init__(self):
        module_name, class_name = locate_responses()
        module = importlib.import_module(module_name)
        self.where = f"{module_name}.{class_name}.{METHOD}"
        self.request_class = module.ResponsesRequest  # the serving module imports it by name
        self.server = object.__new__(getattr(module, class_name))
        self.server.tool_server = None
        self.server.msg_store = {}
        self._hu = importlib.import_module("vllm.entrypoints.openai.parser.harmony_utils")

    def build(self, request):
        _, prompts = self.server._make_request_with_harmony(request, None)
        prompt = prompts[0]
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt.prompt_token_ids
        return list(ids)


def locate_responses():
    """(module, class) of the installed Responses harmony builder, found by reading files."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    relpath, module, cls = RESPONSES_LOCATION
    path = os.path.join(list(spec.submodule_search_locations)[0], relpath)
    if os.path.isfile(path) and f"def {METHOD}(" in _read(path):
        return module, cls
    raise NoBuilder(f"no {METHOD} in {relpath}")


def sections(text):
    """[(role, content)] of a decoded harmony prompt; the role is the header's first word."""
    return [(re.split(r"[\s<]", header, maxsplit=1)[0], body) for header, body in SECTION.findall(text)]
