"""marlin_atomic_add_sm121: atomic-add reduce defaults on for SM121 while VLLM_MARLIN_USE_ATOMIC_ADD is unset.

Snippets are hand-written in the shape of `should_use_atomic_add_reduce` in
`model_executor/layers/quantization/utils/marlin_utils.py` (the same function in 0.15.1-0.33.0).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys
import textwrap
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptoss_patch.patches._base import run_codemod
from gptoss_patch.patches.marlin_atomic_add_sm121 import FUNCTION, HELPER, HELPER_SOURCE, MOE_FILES, SPEC, is_applied
from gptoss_patch.spec import PackageView
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import listed, status_on_fake_site, wheel_source, with_helper
from tests.support import tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)
TARGET = "model_executor/layers/quantization/utils/marlin_utils.py"

REDUCE = """\
def should_use_atomic_add_reduce(m, n, k, device, dtype):
    # only worth it for a thin output and a deep reduction
    if n >= 2048 or k < 2048 or device.type != "cuda":
        return False

    # off unless the user opts in
    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:
        logger.info_once("atomic add reduce is off")
        return False

    # bf16 atomics need sm90+
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return True
"""

GUARD = "    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD:\n"
PATCHED_GUARD = f"    if not envs.VLLM_MARLIN_USE_ATOMIC_ADD and not {HELPER}(device):\n"
PATCHED = with_helper(REDUCE.replace(GUARD, PATCHED_GUARD), HELPER_SOURCE)
# The guard sits in another function; the one in should_use_atomic_add_reduce reads another variable.
GUARD_ELSEWHERE = "def other(device):\n" + GUARD + "        return 1\n\n\n" + REDUCE.replace(GUARD, "    if envs.OTHER:\n")


def test_rewrites_the_env_guard():
    check(REDUCE, PATCHED)


def test_guard_is_matched_whatever_its_spacing():
    spaced = REDUCE.replace(GUARD, "    if not   envs.VLLM_MARLIN_USE_ATOMIC_ADD :\n")
    result = run_codemod(SPEC.codemod(), spaced, PackageView(Path("/nonexistent")))
    assert is_applied(result, None)
    assert f"and not {HELPER}(device)" in result


def test_noop_when_already_patched():
    assert is_applied(PATCHED, None)
    assert "not found" in check_drift(PATCHED)


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param(REDUCE.replace(GUARD, "    if not envs.VLLM_MARLIN_ATOMIC:\n"), "not found", id="env-renamed"),
        pytest.param(REDUCE.replace(FUNCTION, "use_atomic_reduce"), "not found", id="function-renamed"),
        pytest.param(GUARD_ELSEWHERE, "not found", id="guard-only-outside-the-function"),
        pytest.param(REDUCE.replace("    return True\n", GUARD + "        return 0\n    return True\n"), "found 2 times", id="twice"),
    ],
)
def test_drift_when_the_anchor_is_gone_or_ambiguous(source, message):
    assert message in check_drift(source)


def test_is_applied_needs_our_helper_called_from_the_function():
    assert not is_applied(REDUCE, None)
    assert not is_applied("def should_use_atomic_add_reduce(m, n, k, device, dtype):\n    return False\n", None)
    assert not is_applied(REDUCE + "\n\n" + HELPER_SOURCE.lstrip("\n"), None)  # helper defined, never called


class FakeEnvs:
    """vllm.envs-like: VLLM_MARLIN_USE_ATOMIC_ADD is read from the environment, "1" means on."""

    def __getattr__(self, name: str) -> bool:
        return os.environ.get(name, "0") == "1"


def fake_torch(capability: tuple[int, int]) -> SimpleNamespace:
    cuda = SimpleNamespace(get_device_capability=lambda device: capability)
    return SimpleNamespace(bfloat16="bf16", float16="fp16", cuda=cuda)


def decide(source: str, capability: tuple[int, int], monkeypatch, *, n: int = 1024, dtype: str = "fp16") -> bool:
    torch = fake_torch(capability)
    monkeypatch.setitem(sys.modules, "torch", torch)  # the helper imports torch itself
    namespace = {"envs": FakeEnvs(), "torch": torch, "logger": SimpleNamespace(info_once=lambda *a: None)}
    exec(compile(source, "marlin_utils.py", "exec"), namespace)
    return namespace["should_use_atomic_add_reduce"](16, n, 4096, SimpleNamespace(type="cuda"), dtype)


@pytest.mark.parametrize(
    "env, capability, kwargs, stock, patched",
    [
        pytest.param(None, (12, 1), {}, False, True, id="unset-sm121-on"),
        pytest.param(None, (12, 0), {}, False, False, id="unset-sm120-off"),
        pytest.param(None, (9, 0), {}, False, False, id="unset-hopper-off"),
        pytest.param("0", (12, 1), {}, False, False, id="explicit-0-still-disables"),
        pytest.param("1", (12, 1), {}, True, True, id="explicit-1-as-before"),
        pytest.param("1", (8, 6), {"dtype": "bf16"}, False, False, id="bf16-guard-unchanged"),
        pytest.param(None, (12, 1), {"n": 4096}, False, False, id="size-guard-unchanged"),
    ],
)
def test_decision_before_and_after(env, capability, kwargs, stock, patched, monkeypatch):
    if env is not None:
        monkeypatch.setenv("VLLM_MARLIN_USE_ATOMIC_ADD", env)
    assert decide(REDUCE, capability, monkeypatch, **kwargs) is stock
    assert decide(PATCHED, capability, monkeypatch, **kwargs) is patched


def test_sibling_modules_that_import_the_function_by_name_call_the_patched_one(tmp_path, monkeypatch):
    """marlin_utils_fp4.py / marlin_utils_fp8.py do `from ...marlin_utils import should_use_atomic_add_reduce`;
    the patch edits the function's source, so the name they import is the patched function."""
    package = tmp_path / "fake_marlin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text("import os\n\nVLLM_MARLIN_USE_ATOMIC_ADD = os.environ.get('VLLM_MARLIN_USE_ATOMIC_ADD') == '1'\n")
    header = "import torch\n\nfrom fake_marlin_pkg import envs\n\nlogger = None\n\n\n"
    (package / "marlin_utils.py").write_text(header + PATCHED)
    sibling = "from fake_marlin_pkg.marlin_utils import should_use_atomic_add_reduce\n"
    (package / "marlin_utils_fp8.py").write_text(textwrap.dedent(sibling))
    monkeypatch.setitem(sys.modules, "torch", fake_torch((12, 1)))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("", ".envs", ".marlin_utils", ".marlin_utils_fp8"):
        monkeypatch.delitem(sys.modules, "fake_marlin_pkg" + name, raising=False)
    utils = importlib.import_module("fake_marlin_pkg.marlin_utils")
    fp8 = importlib.import_module("fake_marlin_pkg.marlin_utils_fp8")
    assert fp8.should_use_atomic_add_reduce is utils.should_use_atomic_add_reduce
    assert fp8.should_use_atomic_add_reduce(16, 1024, 4096, SimpleNamespace(type="cuda"), "fp16") is True


def test_list_says_plainly_that_stock_moe_has_not_used_atomic_add_since_0120():
    shown = listed(SPEC.id)
    assert "use_atomic_add=False since 0.12.0" in shown
    assert "dense Marlin layers only" in shown
    assert "vary from run to run" in shown  # the determinism trade-off


MOE_CALLING_THE_CHECK = """\
def fused_marlin_moe(hidden_states, w1, w2, device):
    use_atomic_add = should_use_atomic_add_reduce(1, 1024, 4096, device, hidden_states.dtype)
    return moe_wna16_marlin_gemm(hidden_states, w1, use_atomic_add=use_atomic_add)
"""


@pytest.mark.parametrize("moe_file", MOE_FILES)
def test_status_warns_once_the_moe_calls_the_check(tmp_path, moe_file):
    """If upstream routes the Marlin MoE through should_use_atomic_add_reduce, the patch changes gpt-oss's experts too."""
    state, reason = status_on_fake_site(tmp_path / "venv", "0.33.0", {moe_file: MOE_CALLING_THE_CHECK})[SPEC.id]
    assert state == "pending"
    assert f"{moe_file} calls {FUNCTION}" in reason and "VLLM_MARLIN_USE_ATOMIC_ADD=0" in reason


def test_status_says_nothing_while_the_moe_passes_false(tmp_path):
    source = MOE_CALLING_THE_CHECK.replace("should_use_atomic_add_reduce(1, 1024, 4096, device, hidden_states.dtype)", "False")
    _, reason = status_on_fake_site(tmp_path / "venv", "0.33.0", {MOE_FILES[1]: source})[SPEC.id]
    assert reason == "unpatched shape found in vllm 0.33.0"


def test_status_still_patches_the_newest_release_no_upstream_release_fixes_it(tmp_path):
    assert status_on_fake_site(tmp_path / "venv", "0.33.0")[SPEC.id] == ("pending", "unpatched shape found in vllm 0.33.0")


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]
UTILS = "vllm/model_executor/layers/quantization/utils/"


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_siblings_import_the_function_by_name_and_moe_never_uses_atomic_add(version):
    for sibling in ("marlin_utils_fp4.py", "marlin_utils_fp8.py"):
        tree = ast.parse(wheel_source(version, UTILS + sibling))
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imports = [n.module for n in froms if FUNCTION in {a.name for a in n.names}]
        assert imports == ["vllm.model_executor.layers.quantization.utils.marlin_utils"], sibling
        assert not any(isinstance(n, ast.FunctionDef) and n.name == FUNCTION for n in ast.walk(tree)), sibling
    moe = wheel_source(version, "vllm/model_executor/layers/fused_moe/fused_marlin_moe.py") or wheel_source(
        version, "vllm/model_executor/layers/fused_moe/experts/marlin_moe.py"
    )
    passed = set(re.findall(r"use_atomic_add\s*=\s*([^,\s)]+)", moe))
    assert passed == {"False"}
