"""A fake vLLM install built from small hand-written snippets shaped like the upstream code.

Only the statements our codemods anchor on are imitated; nothing here is copied from vLLM. It is
laid out like site-packages (package + .dist-info with METADATA and a RECORD holding real hashes),
inside a real `python -m venv --without-pip`, so target discovery runs for real against it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from packaging.version import Version

from gptoss_patch.engine.record import row
from gptoss_patch.target import Installation
from tests.support.catalogue import stock_states

SERVING = '''\
from vllm.entrypoints.openai.parser.harmony_utils import (
    get_developer_message,
    get_system_message,
    parse_chat_inputs_to_harmony_messages,
    parse_chat_output,
    render_for_completion,
)


class OpenAIServingChat:
    def _make_request_with_harmony(self, request, should_include_tools=True):
        messages = []
        assert not self.supports_browsing
        sys_msg = get_system_message(
            reasoning_effort=request.reasoning_effort,
            with_custom_tools=should_include_tools,
        )
        messages.append(sys_msg)

        # Add developer message.
        if request.tools:
            dev_msg = get_developer_message(tools=request.tools if should_include_tools else None)
            messages.append(dev_msg)

        # Add user message.
        messages.extend(parse_chat_inputs_to_harmony_messages(request.messages))
        return messages, [render_for_completion(messages)]

    async def render_chat_request(self, request):
        tool_parsing_unavailable = (
            self.tool_parser is None and not is_mistral_tokenizer(self.renderer.tokenizer) and not self.use_harmony
        )
        if tool_parsing_unavailable and request.tool_choice not in (None, "none", "auto"):
            return self.create_error_response(f'tool_choice="{request.tool_choice}" requires --tool-call-parser to be set')
        return self._make_request_with_harmony(request)

    async def chat_completion_stream_generator(self, result_generator, harmony_parser):
        async for res in result_generator:
            for token_id in res.outputs[0].token_ids:
                harmony_parser.process(token_id)
                yield harmony_parser.last_content_delta

    async def chat_completion_full_generator(self, request, result_generator, tokenizer):
        async for res in result_generator:
            final_res = res
        for output in final_res.outputs:
            token_ids = output.token_ids
            if self.use_harmony:
                reasoning, content, _ = parse_chat_output(token_ids)
                if self.tool_parser is not None:
                    content = self.tool_parser(tokenizer).extract_tool_calls("", request=request, token_ids=token_ids).content
                    message = ChatMessage(reasoning=reasoning, content=content)
                else:
                    message = ChatMessage(reasoning=reasoning, content=content)
                yield message
'''

MARLIN_UTILS = '''\
import torch

import vllm.envs as envs


def should_use_atomic_add_reduce(m, n, k, device, dtype):
    if n >= 2048 or k < 2048 or device.type != "cuda":
        return False
    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9 or dtype != torch.bfloat16
'''

MXFP4 = '''\
import torch

from vllm.model_executor.layers.quantization.utils.marlin_utils import should_use_atomic_add_reduce


def mxfp4_backend():
    return "marlin"
'''

NVFP4_UTILS = '''\
def cutlass_fp4_supported() -> bool:
    return False
'''

HARMONY_UTILS = '''\
from openai_harmony import Message, Role, SystemContent


def get_system_message(reasoning_effort=None, instructions=None, with_custom_tools=False):
    sys_msg_content = SystemContent.new()
    if reasoning_effort is not None:
        sys_msg_content = sys_msg_content.with_reasoning_effort(reasoning_effort)
    sys_msg = Message.from_role_and_content(Role.SYSTEM, sys_msg_content)
    return sys_msg


def flatten_chat_text_content(content):
    if isinstance(content, list):
        return "".join(item.get("text", "") for item in content if isinstance(item, dict) and item.get("type") == "text")
    return content


def parse_chat_input_to_harmony_message(chat_msg, tool_id_names=None):
    role = chat_msg.get("role")
    msgs = []
    if role == "assistant" and chat_msg.get("tool_calls"):
        content = flatten_chat_text_content(chat_msg.get("content"))
        return msgs
    if role == "tool":
        content = chat_msg.get("content", "") or ""
        content = flatten_chat_text_content(content)
        return [Message.from_role_and_content(Role.TOOL, content)]
    msgs.append(Message.from_role_and_content(role, chat_msg.get("content") or ""))
    return msgs


def parse_output_into_messages(token_ids):
    parser = get_streamable_parser_for_assistant()
    for token_id in token_ids:
        parser.process(token_id)
    return parser
'''

RESPONSES_SERVING = '''\
from vllm.entrypoints.openai.parser.harmony_utils import get_developer_message, get_system_message, get_user_message
from vllm.entrypoints.openai.responses.harmony import response_input_to_harmony


class OpenAIServingResponses:
    def _construct_input_messages_with_harmony(self, request, prev_response):
        messages = []
        if prev_response is None:
            tool_types = {tool.type for tool in request.tools}
            with_custom_tools = "function" in tool_types
            sys_msg = self._construct_harmony_system_input_message(request, with_custom_tools, tool_types)
            messages.append(sys_msg)
            if with_custom_tools:
                messages.append(get_developer_message(instructions=request.instructions, tools=request.tools))
        else:
            messages.extend(self.msg_store[prev_response.id])
        if isinstance(request.input, str):
            messages.append(get_user_message(request.input))
        else:
            prev_outputs = []
            for response_msg in request.input:
                new_msg = response_input_to_harmony(response_msg, prev_outputs)
                if new_msg.author.role != "system":
                    messages.append(new_msg)
        return messages
'''

RESPONSES_HARMONY = '''\
from openai_harmony import Author, Message, Role, TextContent


def _parse_chat_format_message(chat_msg):
    role = chat_msg.get("role")
    if role == "tool":
        return [Message.from_role_and_content(role, chat_msg.get("content") or "")]
    return [Message.from_role_and_content(role, chat_msg.get("content") or "")]


def response_input_to_harmony(response_msg, prev_responses):
    if "type" not in response_msg or response_msg["type"] == "message":
        role = response_msg["role"]
        content = response_msg["content"]
        text_prefix = "Instructions:\\n" if role == "developer" else ""
        if isinstance(content, str):
            msg = Message.from_role_and_content(role, text_prefix + content)
        else:
            contents = [TextContent(text=text_prefix + c["text"]) for c in content]
            msg = Message.from_role_and_contents(role, contents)
    elif response_msg["type"] == "function_call_output":
        call_response = prev_responses[-1]
        msg = Message.from_author_and_content(
            Author.new(Role.TOOL, f"functions.{call_response.name}"),
            response_msg["output"],
        )
    elif response_msg["type"] == "reasoning":
        content = response_msg["content"]
        assert len(content) == 1
        msg = Message.from_role_and_content(Role.ASSISTANT, content[0]["text"])
    else:
        raise ValueError(response_msg["type"])
    return msg
'''

FILES = {
    "vllm/__init__.py": "",
    "vllm/entrypoints/openai/responses/harmony.py": RESPONSES_HARMONY,
    "vllm/entrypoints/openai/responses/serving.py": RESPONSES_SERVING,
    "vllm/entrypoints/openai/chat_completion/serving.py": SERVING,
    "vllm/entrypoints/openai/parser/harmony_utils.py": HARMONY_UTILS,
    "vllm/model_executor/layers/quantization/mxfp4.py": MXFP4,
    "vllm/model_executor/layers/quantization/utils/marlin_utils.py": MARLIN_UTILS,
    "vllm/model_executor/layers/quantization/utils/nvfp4_utils.py": NVFP4_UTILS,
}
SERVING_REL = "vllm/entrypoints/openai/chat_completion/serving.py"
MARLIN_REL = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
MXFP4_REL = "vllm/model_executor/layers/quantization/mxfp4.py"
HARMONY_UTILS_REL = "vllm/entrypoints/openai/parser/harmony_utils.py"
# What each patch reports on this fake 0.17.1 before apply: what its SPEC says of the real 0.17.1,
# which these snippets imitate (a new patch's target needs a snippet here too).
STOCK_STATES = stock_states("0.17.1")
PENDING = sorted(k for k, v in STOCK_STATES.items() if v == "pending")


def record_line(rel: str, data: bytes) -> str:
    return row(rel, data) + "\n"


def build(root: Path, version: str = "0.17.1", files: dict[str, str] | None = None) -> Installation:
    """A venv at `root` whose site-packages holds a fake vllm `version`; returns its Installation."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    dist_info = site / f"vllm-{version}.dist-info"
    dist_info.mkdir()
    rows = []
    for rel, text in {**FILES, **(files or {})}.items():
        data = textwrap.dedent(text).encode()
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        rows.append(record_line(rel, data))
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: fakesite\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
    for name in ("METADATA", "WHEEL"):  # every file pip and uv expect in a .dist-info: `pip check` is clean here
        rows.append(record_line(f"{dist_info.name}/{name}", (dist_info / name).read_bytes()))
    (dist_info / "RECORD").write_text("".join(rows) + f"{dist_info.name}/RECORD,,\n")
    return Installation(str(root / "bin" / "python"), Version(version), site, dist_info)
