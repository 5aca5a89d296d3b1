"""The pure parts of watching vLLM: the backend-line sentinel, the crash diagnosis, the canary's verdicts."""

from __future__ import annotations

import pytest

from gptoss_patch.launcher import knowledge, sentinel, smoke
from gptoss_patch.launcher.results import Status


@pytest.mark.parametrize(
    ("line", "backend"),
    [
        ("(EngineCore_DP0 pid=9) INFO 03-11 10:00:00 [mxfp4.py:165] Using Marlin backend", "MARLIN"),
        ("(EngineCore_DP0 pid=9) INFO 03-11 10:00:00 [mxfp4.py:104] [get_mxfp4_backend_with_lora] Using Marlin backend", "MARLIN"),
        ("INFO 03-11 10:00:00 [mxfp4.py:168] Using Triton backend", "TRITON"),
        ("INFO [mxfp4.py:134] Using FlashInfer MXFP4 MXFP8 TRTLLM backend for SM100", "SM100_FLASHINFER_MXFP4_MXFP8_TRTLLM"),
        ("(EngineCore pid=9) INFO 06-05 [mxfp4.py:547] Using 'MARLIN' Mxfp4 MoE backend.", "MARLIN"),
        ("INFO [mxfp4.py:547] Using 'BATCHED_MARLIN' Mxfp4 MoE backend.", "BATCHED_MARLIN"),
        ("INFO [mxfp4.py:547] Using 'FLASHINFER_CUTLASS_MXFP4_MXFP8' Mxfp4 MoE backend.", "FLASHINFER_CUTLASS_MXFP4_MXFP8"),
        ("[MXFP4] Auto-selected: CUTLASS_FP4 (vLLM native SM120 FP4 grouped GEMM for SM12x)", "CUTLASS_FP4"),
        ("[MXFP4] Using backend: marlin (VLLM_MXFP4_BACKEND=marlin)", "MARLIN"),
    ],
)
def test_backend_lines_of_every_version_are_recognised(line, backend):
    assert sentinel.moe_backend_in(line) == backend


@pytest.mark.parametrize(
    "line",
    [
        "INFO [triton_attn.py:10] Using Triton backend",  # attention, not the MXFP4 MoE
        "INFO [cuda.py:300] Using TRITON_ATTN backend.",
        "Mxfp4 MoE backend 'MARLIN' does not support the deployment configuration.",
    ],
)
def test_other_backend_lines_are_not_taken_for_the_moe_choice(line):
    assert sentinel.moe_backend_in(line) is None


@pytest.mark.parametrize(("backend", "expected", "contradicts"), [
    ("MARLIN", "MARLIN", False), ("BATCHED_MARLIN", "MARLIN", False), ("CUTLASS_FP4", "MARLIN", True),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "MARLIN", True), ("CUTLASS_FP4", None, False),
])  # fmt: skip
def test_only_a_pinned_profile_can_be_contradicted(backend, expected, contradicts):
    assert sentinel.contradicts(backend, expected) is contradicts


def test_crash_diagnosis_names_the_known_issue():
    log = ["INFO starting", "Traceback (most recent call last):", "openai_harmony.HarmonyError: error downloading or loading vocab file: x"]
    assert knowledge.diagnose(log).id == "G01"


def test_crash_diagnosis_prefers_the_fatal_error_to_a_startup_warning():
    log = ["ERROR Failed to import Triton kernels. Please make sure", *["..."] * 10, "ptxas fatal : Value 'sm_121a' is not defined for option 'gpu-name'"]
    assert knowledge.diagnose(log).id == "G16"


def test_an_unknown_crash_has_no_diagnosis():
    assert knowledge.diagnose(["RuntimeError: something else"]) is None


# -- the canary ----------------------------------------------------------------------------------


def test_a_natural_answer_is_not_repetition():
    text = "The capital of France is Paris. It is known for the Eiffel Tower and the Louvre. PAPAYA-7"
    assert smoke.find_repetition(text) is None


@pytest.mark.parametrize(
    ("text", "unit"),
    [("The user is asking about France. " * 30, "The user is asking"), ("Paris" + "!" * 40, "!"), ("ababababababababababababab", "ab")],
)
def test_loops_and_garbage_are_repetition(text, unit):
    found = smoke.find_repetition(text)
    assert found is not None and found[0].startswith(unit)


def payload(content, finish="stop", reasoning="thinking", tokens=20):
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    return {"choices": [{"message": message, "finish_reason": finish}], "usage": {"completion_tokens": tokens}}


def verdicts(report):
    return {c.name: c.status for c in report.checks}


def test_a_good_answer_passes_every_check_and_reports_throughput():
    report = smoke.evaluate("http://x", "m", payload(f"Paris. {smoke.MARKER}"), elapsed=2.0)
    assert report.ok and set(verdicts(report).values()) == {Status.PASS}
    assert report.tokens_per_second == 10.0


def test_null_content_fails_and_says_where_the_text_went():
    report = smoke.evaluate("http://x", "m", payload(None, finish="length", reasoning="a" * 50), elapsed=1.0)
    content = next(c for c in report.checks if c.name == "content")
    assert content.message == "content is null; 50 characters landed in `reasoning`"
    assert verdicts(report)["finish_reason"] is Status.FAIL and not report.ok


def test_an_ignored_system_prompt_fails_pointing_at_g02():
    report = smoke.evaluate("http://x", "m", payload("Paris."), elapsed=1.0)
    instruction = next(c for c in report.checks if c.name == "instruction")
    assert (instruction.status, instruction.issue) == (Status.FAIL, "G02")
