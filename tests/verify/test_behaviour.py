"""Behaviour probes against real vLLM in CPU harness venvs (tests/support/harness.py): stock, patched, broken.

Each `behaviour.run` starts one target process that imports vLLM (about 8 CPU-seconds), so each venv state is probed
once: a stock release's probes all run in one process whose results the tests of that release read (`stock_probes`),
and a band boundary patched with every patch is the run tests/test_coverage.py checks the verdicts of
(`probes_after_apply`, tests/conftest.py), whose evidence and prompts the tests here read.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gptoss_patch import target
from gptoss_patch.verify import behaviour
from tests.support import harness
from tests.support.markers import needs

BOTH = ["harmony_instructions", "marlin_atomic_add_sm121"]
CHANNELS = "harmony_responses_channels"
FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"


@pytest.fixture(scope="module")
@needs("harness")
def stock_0171() -> Path:
    return harness.cpu_venv("0.17.1")


@pytest.fixture(scope="module")
def patched_0171_probes(probes_after_apply: Callable[[str], dict[str, behaviour.ProbeResult]]) -> dict[str, behaviour.ProbeResult]:
    """The probes of 0.17.1 patched with every patch, verbose: the run test_coverage checks at that band boundary."""
    return probes_after_apply("0.17.1")


@pytest.fixture
def vocab_env(monkeypatch: pytest.MonkeyPatch, stock_0171: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(harness.vocab_dir(stock_0171)))


def by_id(results: list[behaviour.ProbeResult]) -> dict[str, behaviour.ProbeResult]:
    return {r.id: r for r in results}


# The probes each stock release's tests read, all in one process per release (verbose: the tests that look at the
# rendered prompts need it, and it changes no verdict or evidence).
STOCK_PROBES = {
    "0.17.1": ["harmony_instructions", "marlin_atomic_add_sm121", "harmony_no_tools_channels", "harmony_stream_guard", CHANNELS],
    "0.18.0": ["harmony_reasoning_effort", CHANNELS],
    "0.22.1": ["harmony_instructions", "harmony_reasoning_effort", CHANNELS],
    "0.25.0": ["harmony_tool_choice_structural"],
}


@pytest.fixture(scope="module")
@needs("harness")
def stock_probes() -> Callable[[str], dict[str, behaviour.ProbeResult]]:
    """The STOCK_PROBES results of a stock harness venv, run once per module on first use."""

    @functools.cache
    def results(version: str) -> dict[str, behaviour.ProbeResult]:
        return harness.probe_results(harness.cpu_venv(version), STOCK_PROBES[version], verbose=True)

    return results


@pytest.fixture(scope="module")
@needs("harness")
def stock_0230_quiet() -> dict[str, behaviour.ProbeResult]:
    """Stock 0.23.0, which carries the upstream fix of harmony_instructions, probed without --verbose: one run for the
    two tests that read it."""
    return harness.probe_results(harness.cpu_venv("0.23.0"), BOTH, verbose=False)


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0171_fails_both_probes_with_the_bug_as_evidence(stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    results = stock_probes("0.17.1")
    harmony, marlin = results["harmony_instructions"], results["marlin_atomic_add_sm121"]
    assert harmony.passed is False
    assert f"{FLAG} unset: 2 system messages (system, system, user): the client's text is a raw system message after vLLM's own" in harmony.evidence
    assert "<|start|>system<|message|>Always answer like a pirate.<|end|>" in harmony.detail
    assert marlin.passed is False
    assert "cc (12, 1) VLLM_MARLIN_USE_ATOMIC_ADD unset returned False, expected True" in marlin.evidence


@pytest.mark.harness
@pytest.mark.probe
def test_patched_0171_passes_both_probes_and_shows_the_prompts_on_verbose(patched_0171_probes: dict[str, behaviour.ProbeResult]) -> None:
    results = patched_0171_probes
    harmony, marlin = results["harmony_instructions"], results["marlin_atomic_add_sm121"]
    assert (harmony.passed, marlin.passed) == (True, True), (harmony.evidence, marlin.evidence)
    assert "<|start|>developer<|message|># Instructions\n\nAlways answer like a pirate.<|end|>" in harmony.detail
    assert "You are ChatGPT, a large language model trained by OpenAI.\nAlways answer like a pirate.\n" in harmony.detail
    assert "cc (12, 1) VLLM_MARLIN_USE_ATOMIC_ADD unset: True" in marlin.evidence
    assert "marlin_utils_fp4 and marlin_utils_fp8 share the function" in marlin.evidence


@pytest.mark.harness
@pytest.mark.probe
def test_without_verbose_no_prompt_is_returned(stock_0230_quiet: dict[str, behaviour.ProbeResult]) -> None:
    # A passing harmony probe renders prompts; whether they come back depends only on --verbose (the probe's own
    # switch, the same on every release, patched or not), so the quiet run of stock 0.23.0 shows it.
    result = stock_0230_quiet["harmony_instructions"]
    assert result.passed is True and result.detail == ""


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0230_passes_the_harmony_probe_through_the_render_server_class(stock_0230_quiet: dict[str, behaviour.ProbeResult]) -> None:
    # 0.23.0 carries the upstream fix (vllm#44330): the probe can pass on unpatched code.
    results = stock_0230_quiet
    assert results["harmony_instructions"].passed is True, results["harmony_instructions"].evidence
    assert results["marlin_atomic_add_sm121"].passed is False  # stock: the SM121 default is ours


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0221_reports_the_bug_through_openai_serving_render(stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    result = stock_probes("0.22.1")["harmony_instructions"]
    assert result.passed is False
    assert "raw system message after vLLM's own" in result.evidence


@pytest.mark.harness
@pytest.mark.probe
def test_patched_0221_passes_both_probes(probes_after_apply: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    results = [probes_after_apply("0.22.1")[pid] for pid in BOTH]
    assert [(r.id, r.passed) for r in results] == [(pid, True) for pid in BOTH], [r.evidence for r in results]


@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.usefixtures("vocab_env")
def test_a_crash_inside_vllm_fails_that_probe_with_the_exceptions_last_line(stock_0171: Path, tmp_path: Path) -> None:
    python = harness.clone_venv(stock_0171, tmp_path / "broken")
    serving = harness.site_packages(python) / "vllm/entrypoints/openai/chat_completion/serving.py"
    source = serving.read_text(encoding="utf-8")
    anchor = "        assert not self.supports_browsing\n"
    assert source.count(anchor) == 1
    harness.replace_file(serving, source.replace(anchor, "        raise RuntimeError('boom from a test')\n" + anchor))
    (result,) = behaviour.run(str(python), ["harmony_instructions"], verbose=False)
    assert result.passed is False
    assert result.evidence.startswith("crashed: RuntimeError: boom from a test (at vllm/entrypoints/openai/chat_completion/serving.py:")


@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.usefixtures("vocab_env")
def test_a_probe_that_kills_the_process_fails_and_later_probes_did_not_run(stock_0171: Path, tmp_path: Path) -> None:
    python = harness.clone_venv(stock_0171, tmp_path / "dying")
    marlin = harness.site_packages(python) / "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
    source = marlin.read_text(encoding="utf-8")
    anchor = "    if n >= 2048 or k < 2048"
    harness.replace_file(marlin, source.replace(anchor, "    import os; os._exit(3)\n" + anchor, 1))
    results = by_id(behaviour.run(str(python), ["marlin_atomic_add_sm121", "harmony_instructions"], verbose=False))
    assert results["marlin_atomic_add_sm121"].passed is False
    assert results["marlin_atomic_add_sm121"].evidence.startswith("crashed: the probe process died (exit code 3)")
    assert results["harmony_instructions"].passed is None
    assert results["harmony_instructions"].evidence.startswith("not run: the probe process stopped before it")


@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.usefixtures("vocab_env")
def test_a_missing_package_is_named_with_a_pip_command_never_passed(stock_0171: Path, tmp_path: Path) -> None:
    python = harness.clone_venv(stock_0171, tmp_path / "no-harmony")
    shutil.rmtree(harness.site_packages(python) / "openai_harmony")  # unlinks the clone's links only
    (result,) = behaviour.run(str(python), ["harmony_instructions"], verbose=False)
    assert (result.passed, result.missing) == (None, ("openai-harmony",))
    pinned = behaviour.vllm_pins(str(python)).get("openai-harmony", "openai-harmony")  # vLLM's own requirement
    assert result.evidence.endswith(f"install with: {target.pip_command(str(python), 'install', pinned)}")


def test_a_bare_interpreter_lacks_vllm_torch_and_openai_harmony(tmp_path: Path, vocab_dir_ok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(vocab_dir_ok))
    results = by_id(behaviour.run(str(tmp_path / "bare/bin/python"), BOTH, verbose=False))
    assert results["harmony_instructions"].missing == ("vllm", "torch", "openai-harmony")
    assert results["marlin_atomic_add_sm121"].missing == ("vllm", "torch")
    assert all(r.passed is None for r in results.values())


def test_without_a_loadable_vocabulary_the_harmony_probe_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))  # no o200k_base.tiktoken there
    (result,) = behaviour.run(sys.executable, ["harmony_instructions"], verbose=False)
    assert result.passed is None
    assert result.missing == (behaviour.VOCAB_MISSING,)
    assert "does not exist" in result.evidence


def test_a_patch_without_a_probe_could_not_run() -> None:
    (result,) = behaviour.run(sys.executable, ["mxfp4_fp4_import"], verbose=False)
    assert (result.passed, result.evidence) == (None, "no behaviour probe for this patch")


def test_the_probe_environment_pins_the_date_and_points_at_the_installed_vocabulary(vocab_dir_ok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(vocab_dir_ok.parent.parent))
    env, problem = behaviour.probe_environment({"VLLM_MARLIN_USE_ATOMIC_ADD": "1", "PATH": "/bin"})
    assert problem is None
    assert env["VLLM_SYSTEM_START_DATE"] == behaviour.START_DATE
    assert env["TIKTOKEN_ENCODINGS_BASE"] == str(vocab_dir_ok)
    assert "VLLM_MARLIN_USE_ATOMIC_ADD" not in env  # the probe sets it per case


@pytest.fixture(scope="module")
@needs("upstream")
def vocab_dir_ok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real installed vocabulary laid out as $XDG_CACHE_HOME/gptoss-patch/tiktoken."""
    from gptoss_patch import vocab

    directory = tmp_path_factory.mktemp("xdg") / "gptoss-patch" / "tiktoken"
    vocab.install(None, directory)
    return directory


CATALOGUE = ["harmony_no_tools_channels", "harmony_stream_guard"]


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0171_reproduces_g04_and_g05(stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    results = stock_probes("0.17.1")
    channels, stream = results["harmony_no_tools_channels"], results["harmony_stream_guard"]
    assert channels.passed is False
    assert "`commentary` is still valid without custom tools (G04)" in channels.evidence
    assert stream.passed is False
    assert "Unexpected token 200002 while expecting start token 200006" in stream.evidence


@pytest.mark.harness
@pytest.mark.probe
def test_patched_0171_restricts_channels_and_keeps_streaming(patched_0171_probes: dict[str, behaviour.ProbeResult]) -> None:
    channels, stream = patched_0171_probes["harmony_no_tools_channels"], patched_0171_probes["harmony_stream_guard"]
    assert channels.passed is True, channels.evidence
    assert "without custom tools: analysis, final; with custom tools: analysis, commentary, final" in channels.evidence
    assert stream.passed is True, stream.evidence
    assert "skipped token 200002, the stream went on: ['Hello', ' world']" in stream.evidence


EFFORT = "harmony_reasoning_effort"


@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.parametrize(
    ("version", "failure"),
    [("0.18.0", "minimal: KeyError: 'minimal'"), ("0.22.1", "minimal: ValueError: reasoning_effort='minimal' is not supported by Harmony")],
    ids=["vllm-0.18.0-keyerror", "vllm-0.22.1-valueerror"],
)
def test_stock_rejects_minimal_and_patched_renders_reasoning_low(
    version: str, failure: str, stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]],
    probes_after_apply: Callable[[str], dict[str, behaviour.ProbeResult]]
) -> None:
    before = stock_probes(version)[EFFORT]
    assert before.passed is False and failure in before.evidence, before.evidence
    after = probes_after_apply(version)[EFFORT]
    assert after.passed is True, after.evidence
    assert "minimal -> Reasoning: low; xhigh -> Reasoning: high; max -> Reasoning: high; medium -> Reasoning: medium" in after.evidence
    assert "GPTOSS_PATCH_REASONING_EFFORT_MAP='{}': minimal rejected" in after.evidence
    assert "\nReasoning: low\n" in after.detail


def fake_vllm_venv(root: Path, requires: list[str]) -> Path:
    """A venv without pip whose `vllm` is a stand-in with a real .dist-info (METADATA, RECORD): nothing to download."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    dist_info = site / "vllm-0.22.1.dist-info"
    dist_info.mkdir()
    metadata = ["Metadata-Version: 2.1", "Name: vllm", "Version: 0.22.1", *(f"Requires-Dist: {r}" for r in requires)]
    (dist_info / "METADATA").write_text("\n".join(metadata) + "\n")
    (dist_info / "RECORD").write_text("vllm/__init__.py,,\nvllm-0.22.1.dist-info/METADATA,,\nvllm-0.22.1.dist-info/RECORD,,\n")
    return python


def test_a_missing_package_is_suggested_with_the_installed_vllms_own_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.22.1 pins torch==2.11.0: an unpinned `pip install torch` would take the newest torch and break it."""
    requires = ["torch==2.11.0", "numpy", 'pytest>=8; extra == "test"', 'torch==9.9; sys_platform == "nonesuch"']
    python = fake_vllm_venv(tmp_path / "venv", requires)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")  # uv beside the test's Python
    monkeypatch.setenv("GPTOSS_PATCH_CACHE", str(tmp_path / "cache"))
    assert behaviour.vllm_pins(str(python)) == {"torch": "torch==2.11.0"}
    (result,) = behaviour.run(str(python), ["marlin_atomic_add_sm121"], verbose=False)
    assert (result.passed, result.missing) == (None, ("torch",)), result.evidence
    assert shutil.which("uv"), "the dev venv has uv"
    assert result.evidence.endswith(f"install with: uv pip install --python {python} torch==2.11.0")  # no pip in that venv


# harmony_responses_channels (G53): Responses input items through the installed item converter.
TOOL_OUTPUT_BARE = "function_call_output: rendered '<|start|>functions.get_weather<|message|>Sunny, 21 C<|end|>'"
REASONING_ASSERT = "reasoning with two parts: AssertionError (at vllm/entrypoints/openai/responses/harmony.py:"
EMPTY_ASSERT = "reasoning without content: AssertionError (at vllm/entrypoints/openai/responses/harmony.py:"


@pytest.mark.harness
@pytest.mark.probe
@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [("0.17.1", [TOOL_OUTPUT_BARE, REASONING_ASSERT, EMPTY_ASSERT], []),
     ("0.18.0", [TOOL_OUTPUT_BARE], ["reasoning with two parts", "reasoning without content"])],
    ids=["vllm-0.17.1-both", "vllm-0.18.0-tool-output-only"],
)
def test_stock_fails_the_channels_probe_on_the_items_it_gets_wrong(
    version: str, present: list[str], absent: list[str], stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]
) -> None:
    result = stock_probes(version)[CHANNELS]
    assert result.passed is False
    assert result.evidence.startswith("vllm.entrypoints.openai.responses.harmony.response_input_to_harmony: "), result.evidence
    assert all(p in result.evidence for p in present), result.evidence
    assert not any(a in result.evidence for a in absent), result.evidence  # 0.18.0's reasoning branch is upstream's fix


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0221_passes_the_channels_probe(stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    # 0.22.0 is the fixing release (fixed_in): its own converter passes, so the probe can pass on unpatched code.
    result = stock_probes("0.22.1")[CHANNELS]
    assert result.passed is True, result.evidence


@pytest.mark.harness
@pytest.mark.probe
def test_patched_0171_renders_responses_items_on_their_channels(patched_0171_probes: dict[str, behaviour.ProbeResult]) -> None:
    result = patched_0171_probes[CHANNELS]
    assert result.passed is True, result.evidence
    assert "a reasoning item without content is no message (as 0.22.0)" in result.evidence
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>Sunny, 21 C<|end|>" in result.detail
    assert ("<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.\nI should call get_weather.<|end|>"
            in result.detail)
    assert "--- reasoning without content\nNone" in result.detail


# -- harmony_tool_choice_structural (G52): 0.25.0, stock and with the default set ---------------------------------
TOOL_CHOICE = "harmony_tool_choice_structural"


@pytest.mark.harness
@pytest.mark.probe
def test_stock_0250_has_no_harmony_adjust_request(stock_probes: Callable[[str], dict[str, behaviour.ProbeResult]]) -> None:
    result = stock_probes("0.25.0")[TOOL_CHOICE]
    assert result.passed is False
    assert "HarmonyParser has no adjust_request of its own" in result.evidence


@pytest.mark.harness
@pytest.mark.probe
@needs("harness")
def test_patched_0250_admits_only_tool_calls(applied: Callable[[str], Path]) -> None:
    # after a plain `apply` (tests/conftest.py): the default set holds the pair
    result = harness.probe_results(applied("0.25.0"), [TOOL_CHOICE], verbose=True)[TOOL_CHOICE]
    assert result.passed is True, result.evidence
    for line in ("required, recipient-first call: admitted", "required, final prose: rejected",
                 "named get_weather, call of the other tool: rejected",
                 "named get_weather, arguments against the schema: rejected"):
        assert line in result.detail
