"""The smoke canary's rendering verdict, on decoded prompts shaped like what the servers render (no server needed).

The canary sends a system message and then a developer message, each with its own marker. The prompts
below are what vLLM renders for that request (harmony_instructions, tests/support/chat_cases.py's
`system_then_developer` case): stock 0.17.1 (a raw second system message, G02), patched 0.17.1 / stock
0.23.0 with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset (both in developer instructions), and with it
at 1 (the system text in the system message, the developer message emptied).
"""

from __future__ import annotations

from gptoss_patch.launcher import smoke
from gptoss_patch.launcher.results import Status

SYSTEM, DEVELOPER = "CANARY-S1a2b3c4d", "CANARY-D1a2b3c4d"
MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
TAIL = "Knowledge cutoff: 2024-06\nCurrent date: 2026-01-01\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final."
USER = "<|start|>user<|message|>hi<|end|><|start|>assistant"

STOCK_0171 = (
    f"<|start|>system<|message|>{MODEL_IDENTITY}\n{TAIL}<|end|>"
    f"<|start|>system<|message|>Carry the code {SYSTEM}.<|end|>"
    f"<|start|>developer<|message|>Also carry the code {DEVELOPER}.<|end|>{USER}"
)
UNSET = (  # upstream's default: patched 0.17.1/0.22.1, stock 0.23.0, `serve` (--instructions developer)
    f"<|start|>system<|message|>{MODEL_IDENTITY}\n{TAIL}<|end|>"
    f"<|start|>developer<|message|># Instructions\n\nCarry the code {SYSTEM}.<|end|>"
    f"<|start|>developer<|message|># Instructions\n\nAlso carry the code {DEVELOPER}.<|end|>{USER}"
)
FLAG_1 = (  # VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 (--instructions system): the developer message is empty
    f"<|start|>system<|message|>{MODEL_IDENTITY}\nCarry the code {SYSTEM}.\n{TAIL}<|end|>"
    f"<|start|>developer<|message|><|end|>{USER}"
)


def verdict(prompt: str):
    return smoke.rendering_verdict(smoke.locate_marker(prompt, SYSTEM), smoke.locate_marker(prompt, DEVELOPER), 77)


def test_both_messages_in_the_developer_instructions_pass():
    check = verdict(UNSET)
    assert check.status is Status.PASS, check
    assert check.message == ("both in the harmony instructions: the client's system message in the developer message's "
                             "instructions, its developer message in the developer message's instructions (77 prompt tokens)")


def test_a_raw_second_system_message_fails_naming_the_patch_and_g02():
    check = verdict(STOCK_0171)
    assert (check.status, check.issue) == (Status.FAIL, "G02")
    assert "raw second harmony system message" in check.message and "harmony_instructions" in check.fix


def test_an_emptied_developer_message_fails_naming_the_system_placement():
    assert smoke.locate_marker(FLAG_1, SYSTEM) == "system-instructions"
    assert smoke.locate_marker(FLAG_1, DEVELOPER) == "missing"
    check = verdict(FLAG_1)
    assert (check.status, check.issue) == (Status.FAIL, "G02")
    assert check.message.startswith("the client's developer message is missing from the rendered prompt")
    assert "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1" in check.message and "--instructions system" in check.message
    assert "--instructions developer" in check.fix and "unset" in check.fix


def test_a_missing_system_message_fails():
    prompt = f"<|start|>system<|message|>{MODEL_IDENTITY}<|end|><|start|>developer<|message|># Instructions\n\n{DEVELOPER}<|end|>{USER}"
    check = verdict(prompt)
    assert check.status is Status.FAIL and "(found: missing)" in check.message


def test_a_developer_message_outside_the_instructions_fails():
    prompt = (f"<|start|>system<|message|>{MODEL_IDENTITY}<|end|><|start|>developer<|message|># Instructions\n\n{SYSTEM}<|end|>"
              f"<|start|>developer<|message|>{DEVELOPER}<|end|>{USER}")
    check = verdict(prompt)
    assert check.status is Status.FAIL and "(found: developer-message)" in check.message
    assert "harmony_instructions" in check.fix


def test_check_rendering_sends_a_system_and_a_developer_message_with_distinct_markers(monkeypatch):
    sent: list[dict] = []

    def post(url, body, api_key, timeout):  # a server with the system placement: the developer text is dropped
        sent.append(body)
        if url.endswith("/detokenize"):
            system = sent[0]["messages"][0]["content"]
            return 200, {"prompt": f"<|start|>system<|message|>{MODEL_IDENTITY}\n{system}<|end|><|start|>developer<|message|><|end|>{USER}"}, None
        return 200, {"prompt_token_ids": [1, 2, 3], "choices": [{"logprobs": {"content": [{"logprob": -0.5}]}}]}, None

    monkeypatch.setattr(smoke, "_post_json", post)
    check, logprob = smoke.check_rendering("http://x", "m", None, 1.0)

    roles = [m["role"] for m in sent[0]["messages"]]
    system, developer = (m["content"].split()[-1].rstrip(".") for m in sent[0]["messages"][:2])
    assert roles == ["system", "developer", "user"]
    assert system.startswith(smoke.RENDER_MARKER) and developer.startswith(smoke.RENDER_MARKER)
    assert system not in developer and developer not in system
    assert check.status is Status.FAIL and "--instructions system" in check.message and logprob == -0.5


# -- G49: `stop` strings match inside gpt-oss's reasoning ---------------------------------------------------------


def test_a_request_that_sets_stop_is_warned_about_the_reasoning_channel():
    (check,) = smoke.stop_string_checks({"model": "m", "messages": [], "stop": ["\n\n", "END"]})
    assert (check.name, check.status, check.issue) == ("stop", Status.WARN, "G49")
    assert check.message.startswith('the request sets stop ["\\n\\n", "END"]: `stop` strings also match inside')
    assert "vllm#52599" in check.message and 'finish_reason "stop"' in check.message
    assert check.fix == "drop `stop` and cut the final answer at the string on the client"
    (single,) = smoke.stop_string_checks({"stop": "END"})
    assert 'sets stop ["END"]' in single.message


def test_smokes_own_request_sets_no_stop_and_gets_no_row():
    assert smoke.stop_string_checks(smoke._request_body("m")) == ()
    assert smoke.stop_string_checks({"stop": []}) == () and smoke.stop_string_checks({"stop": None}) == ()
