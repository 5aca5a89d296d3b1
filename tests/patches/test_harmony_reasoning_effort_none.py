"""harmony_reasoning_effort_none: Chat Completions rejects `none` only when the effort map leaves it `none`.

Snippets are hand-written in the shape of `_make_request_with_harmony` (OpenAIServingRender in
entrypoints/serve/render/serving.py, 0.18.0-0.24.0; OnlineRenderer in renderers/online_renderer.py,
0.25.0-0.32.0): the `none` check and the system message built after it. The behaviour is checked on the
CPU harness venvs of 0.18.0 and 0.22.1, through the real builder.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from functools import partial
from pathlib import Path

import pytest

from gptoss_patch.patches import harmony_reasoning_effort
from gptoss_patch.patches.harmony_reasoning_effort_none import (
    HELPER,
    HELPER_SOURCE,
    MARK,
    RENDERER_TARGET,
    SPEC,
    fixed_upstream,
    is_applied,
)
from tests.patches.helpers import status_on_fake_site, with_helper
from tests.support import harness, tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

CHECK = '        if (reasoning_effort := request.reasoning_effort) == "none":\n'
BUILDER = f"""\
class OnlineRenderer:
    def _make_request_with_harmony(self, request, should_include_tools=True):
        messages = []
{CHECK}            raise ValueError(f"Harmony does not support {{reasoning_effort=}}")
        messages.append(get_system_message(reasoning_effort=reasoning_effort))
        return messages

    def render_chat(self, request):
        if request.reasoning_effort == "none":
            return None
        return self._make_request_with_harmony(request)
"""
PATCHED = with_helper(
    BUILDER.replace(CHECK, f'        if {HELPER}(reasoning_effort := request.reasoning_effort) == "none":  {MARK}\n'),
    HELPER_SOURCE,
)


def test_rewrites_only_the_none_check():
    check(BUILDER, PATCHED)


def test_noop_when_already_patched():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(BUILDER.replace(CHECK, '        if request.reasoning_effort == "none":\n'), "not found", id="check-changed"),
        pytest.param(BUILDER.replace("_make_request_with_harmony(self", "_build(self"), "not found", id="method-renamed"),
        pytest.param(BUILDER.replace("        messages = []\n", "        messages = []\n" + CHECK + "            pass\n"),
                     "found 2 times", id="check-twice"),
    ],
)
def test_drift_when_the_check_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_the_helper_called_from_the_builder():
    assert not is_applied(BUILDER, None)
    assert not is_applied(BUILDER + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)


def run_helper(harmony_utils_source: str | None, effort: str | None) -> str | None:
    """The appended helper, run against a stand-in `vllm.entrypoints.openai.parser.harmony_utils`."""
    import sys
    import types

    names = ["vllm", "vllm.entrypoints", "vllm.entrypoints.openai", "vllm.entrypoints.openai.parser",
             "vllm.entrypoints.openai.parser.harmony_utils"]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            sys.modules[name] = types.ModuleType(name)
        for parent, child in zip(names, names[1:]):
            setattr(sys.modules[parent], child.rsplit(".", 1)[1], sys.modules[child])
        if harmony_utils_source is not None:
            exec(harmony_utils_source, sys.modules[names[-1]].__dict__)  # noqa: S102 - our own test snippet
        namespace: dict = {}
        exec(HELPER_SOURCE, namespace)  # noqa: S102 - the patch's own helper
        return namespace[HELPER](effort)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def test_helper_reads_harmony_reasoning_effort_s_map_once():
    chained = "def _gptoss_patch_reasoning_effort(effort):\n    return {'none': 'low', 'low': 'medium'}.get(effort, effort)\n"
    assert run_helper(chained, "none") == "low"
    assert run_helper(chained, "high") == "high"


def test_the_map_it_reads_is_the_one_harmony_reasoning_effort_appends_to_harmony_utils():
    from gptoss_patch.patches import harmony_reasoning_effort

    assert f'getattr(_hu, "{harmony_reasoning_effort.HELPER}", None)' in HELPER_SOURCE
    assert harmony_reasoning_effort.SPEC.bands[0].target == "entrypoints/openai/parser/harmony_utils.py"
    assert harmony_reasoning_effort.SPEC.bands[0].versions == ">=0.18.0,<0.33"  # covers both bands of this patch


def test_helper_maps_nothing_without_harmony_reasoning_effort():
    assert run_helper(None, "none") == "none"
    assert run_helper(None, None) is None


def test_fixed_upstream_where_the_renderer_maps_before_the_check(fake_package):
    fixed = fake_package({RENDERER_TARGET: textwrap.dedent("""\
        class OnlineRenderer:
            def _make_request_with_harmony(self, request):
                reasoning_effort = map_reasoning_effort(request.reasoning_effort, self.reasoning_effort_map)
                if reasoning_effort == "none":
                    raise ValueError("none")
        """)}, "fixed")
    assert "--reasoning-effort-map" in fixed_upstream(fixed)
    assert fixed_upstream(fake_package({RENDERER_TARGET: BUILDER}, "stock")) is None
    assert fixed_upstream(fake_package({}, "none")) is None


def test_status_at_fixed_in(tmp_path):
    fix = textwrap.dedent("""\
        class OnlineRenderer:
            def _make_request_with_harmony(self, request):
                reasoning_effort = map_reasoning_effort(request.reasoning_effort, {})
                if reasoning_effort == "none":
                    raise ValueError("none")
        """)
    fixed = status_on_fake_site(tmp_path / "fixed", "0.33.0", {RENDERER_TARGET: fix})[SPEC.id]
    missing = status_on_fake_site(tmp_path / "missing", "0.33.0")[SPEC.id]
    assert fixed[0] == "fixed-upstream" and "map_reasoning_effort" in fixed[1]
    assert missing == ("drifted", "vllm 0.33.0 should carry the upstream fix (since 0.33.0) but it was not found")


# -- behaviour on the CPU harness, through the real builder ----------------------------------------------

RENDER = """\
import json, os, re, sys
sys.path.insert(0, sys.argv[1])
from _builder import Builder
builder = Builder()
out = {}
for label, effort_map in json.loads(sys.argv[2]).items():
    if effort_map is None:
        os.environ.pop("GPTOSS_PATCH_REASONING_EFFORT_MAP", None)
    else:
        os.environ["GPTOSS_PATCH_REASONING_EFFORT_MAP"] = effort_map
    for effort in json.loads(sys.argv[3]):
        try:
            text = builder.decode(builder.build(builder.request({"messages": [{"role": "user", "content": "hi"}],
                                                                  "reasoning_effort": effort})))
            found = re.search(r"^Reasoning: (\\w+)$", text, re.MULTILINE)
            out[f"{label}/{effort}"] = "Reasoning: " + (found.group(1) if found else "?")
        except Exception as exc:
            out[f"{label}/{effort}"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
"""
MAPS = {"unset": None, "none-low": '{"none": "low"}', "chained": '{"none": "low", "low": "medium"}', "empty": "{}"}
# Every effort the releases' Chat Completions protocol takes; harmony's system message knows low, medium and high.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
KNOWN = ("low", "medium", "high")
REJECTED = "ValueError: Harmony does not support reasoning_effort='none'"


def render(python: Path, tmp_path: Path) -> dict[str, str]:
    probes = Path(__import__("gptoss_patch.verify.probes", fromlist=["_"]).__file__).parent
    script = tmp_path / "render.py"
    script.write_text(RENDER)
    # The test's own HOME and TMPDIR: in a bare environment torch made its inductor cache in the machine's /tmp.
    env = {**harness.script_env(python), "HF_HUB_OFFLINE": "1"}
    env.pop("GPTOSS_PATCH_REASONING_EFFORT_MAP", None)  # the script sets it per map
    proc = subprocess.run([str(python), str(script), str(probes), json.dumps(MAPS), json.dumps(EFFORTS)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, (proc.stdout + proc.stderr)[-2000:]
    return json.loads(line.removeprefix("RESULT "))


HARNESS_RELEASES = ("0.18.0", "0.22.1")  # the CPU harness venvs it builds (tests/support/prewarm.py)
PROTOCOL_REFUSES = {"0.18.0": ("minimal", "xhigh", "max"), "0.22.1": ()}  # efforts ChatCompletionRequest's Literal lacks (wheels)


@pytest.mark.harness
@pytest.mark.parametrize("version", HARNESS_RELEASES)
def test_none_is_mapped_once_when_the_map_names_it_and_rejected_as_stock_otherwise(version: str, tmp_path: Path):
    """Also harmony_reasoning_effort's default map through the same builder (a real server reads the map from its
    environment in tests/e2e/test_reasoning_effort.py): stock rejects every effort harmony does not know."""
    stock = harness.clone_venv(harness.cpu_venv(version), tmp_path / "stock")
    patched = harness.clone_venv(harness.cpu_venv(version), tmp_path / "patched")
    harness.apply_patches(patched, ("harmony_instructions", "harmony_reasoning_effort", SPEC.id))
    before, after = render(stock, tmp_path), render(patched, tmp_path)

    assert {k: v for k, v in before.items() if k.endswith("/none")} == {f"{label}/none": REJECTED for label in MAPS}
    assert after["none-low/none"] == "Reasoning: low"  # 0.33.0 with --reasoning-effort-map '{"none": "low"}'
    assert after["chained/none"] == "Reasoning: low"  # one step, never none -> low -> medium
    assert after["chained/low"] == "Reasoning: medium"  # the map itself still applies in get_system_message
    assert after["unset/none"] == after["empty/none"] == REJECTED  # no map entry: stock's 400
    assert [after[f"{label}/low"] for label in ("unset", "none-low", "empty")] == ["Reasoning: low"] * 3
    assert [before[f"{label}/low"] for label in MAPS] == ["Reasoning: low"] * 4
    # Stock: what harmony does not know is an error (a 400 from the server), the three it knows render as asked.
    unknown = [effort for effort in EFFORTS if effort not in KNOWN]
    assert [before[f"unset/{effort}"].startswith("Reasoning: ") for effort in unknown] == [False] * len(unknown), before
    assert [before[f"unset/{effort}"] for effort in KNOWN] == [f"Reasoning: {effort}" for effort in KNOWN]
    # Patched, no map set: harmony_reasoning_effort's default map, the known three untouched, `none` still stock's 400;
    # an effort the release's request model refuses (a pydantic error, before any patched code) stays refused.
    refused = PROTOCOL_REFUSES[version]
    default = {effort: f"Reasoning: {harmony_reasoning_effort.DEFAULT_MAP.get(effort, effort)}" for effort in EFFORTS}
    expected = {**default, "none": REJECTED, **{effort: before[f"unset/{effort}"] for effort in refused}}
    assert {effort: after[f"unset/{effort}"] for effort in EFFORTS} == expected
    assert all(before[f"unset/{effort}"].startswith("ValidationError") for effort in refused)
    assert harmony_reasoning_effort.DEFAULT_MAP == {"minimal": "low", "xhigh": "high", "max": "high"}
