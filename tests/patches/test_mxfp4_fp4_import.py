"""mxfp4_fp4_import: a fork's `cutlass_fp4_supported` import in mxfp4.py points at the module that defines it.

Stock `quantization/mxfp4.py` never imports the name (0.15.1-0.33.0); fork patch sets add
`from ...utils.quant_utils import cutlass_fp4_supported`. The snippets below are hand-written: the
fork-style import plus one-line modules that define (or do not define) the function.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from gptoss_patch.patches.mxfp4_fp4_import import SPEC, absolute_module, is_applied, not_needed
from gptoss_patch.versions import KNOWN_RELEASES
from tests.patches.helpers import listed, status_on_fake_site, wheel_source
from tests.support import tools

TARGET = "model_executor/layers/quantization/mxfp4.py"
QUANT_UTILS = "model_executor/layers/quantization/utils/quant_utils.py"
NVFP4_UTILS = "model_executor/layers/quantization/utils/nvfp4_utils.py"
DEFINITION = "def cutlass_fp4_supported() -> bool:\n    return True\n"
# Where the function lives: 0.15.x in quant_utils, 0.16.0 and later in nvfp4_utils.
LAYOUT_015 = {QUANT_UTILS: DEFINITION, NVFP4_UTILS: "def other():\n    pass\n"}
LAYOUT_016 = {QUANT_UTILS: "def scaled_quantize():\n    pass\n", NVFP4_UTILS: DEFINITION}
QUANT_UTILS_MODULE = "vllm.model_executor.layers.quantization.utils.quant_utils"
NVFP4_UTILS_MODULE = "vllm.model_executor.layers.quantization.utils.nvfp4_utils"
FROM_QUANT_UTILS = f"from {QUANT_UTILS_MODULE} import cutlass_fp4_supported"
FROM_NVFP4_UTILS = f"from {NVFP4_UTILS_MODULE} import cutlass_fp4_supported"
FROM_RELATIVE = "from .utils.quant_utils import cutlass_fp4_supported"

STOCK = """\
import torch

from vllm.model_executor.layers.quantization.base_config import QuantizationConfig


class Mxfp4Config(QuantizationConfig):
    pass
"""


def fork(import_line: str) -> str:
    """mxfp4.py after a fork's diff added `import_line` under the stock imports."""
    return STOCK.replace("\n\n\nclass", f"\n{import_line}\n\n\nclass")


@pytest.mark.parametrize(
    "import_line, layout, expected",
    [
        pytest.param(FROM_QUANT_UTILS, LAYOUT_016, NVFP4_UTILS_MODULE, id="absolute-quant_utils-on-0.16+"),
        pytest.param(FROM_RELATIVE, LAYOUT_016, NVFP4_UTILS_MODULE, id="relative-quant_utils-on-0.16+"),
        pytest.param(FROM_NVFP4_UTILS, LAYOUT_015, QUANT_UTILS_MODULE, id="nvfp4_utils-on-0.15"),
        pytest.param(FROM_QUANT_UTILS + " as fp4_ok", LAYOUT_016, NVFP4_UTILS_MODULE, id="alias-kept"),
    ],
)
def test_points_the_import_at_the_defining_module(import_line, layout, expected, tmp_path):
    after_line = f"from {expected} import {import_line.split(' import ', 1)[1]}"
    tools.check_transformed(fork(import_line), fork(after_line), spec=SPEC, tmp_path=tmp_path, package_files=layout)


def test_rewrites_an_import_inside_try(tmp_path):
    before = STOCK + f"\ntry:\n    {FROM_RELATIVE}\nexcept ImportError:\n    cutlass_fp4_supported = None\n"
    after = before.replace("from .utils.quant_utils", f"from {NVFP4_UTILS_MODULE}")
    tools.check_transformed(before, after, spec=SPEC, tmp_path=tmp_path, package_files=LAYOUT_016)


def test_noop_when_already_patched(fake_package, tmp_path):
    correct = fork(FROM_NVFP4_UTILS)
    package = fake_package(LAYOUT_016)
    assert is_applied(correct, package)
    assert not_needed(correct, package) is None
    assert "not found" in tools.check_drift(correct, spec=SPEC, tmp_path=tmp_path, package_files=LAYOUT_016)


def test_not_needed_on_stock_mxfp4(fake_package):
    package = fake_package(LAYOUT_016)
    assert "stock vLLM never does" in not_needed(STOCK, package)
    assert not is_applied(STOCK, package)  # no import at all is "not needed", never "applied"


@pytest.mark.parametrize(
    "source, layout, message",
    [
        pytest.param(
            fork(FROM_QUANT_UTILS),
            {QUANT_UTILS: "def a():\n    pass\n", NVFP4_UTILS: "def b():\n    pass\n"},
            "no module of the installed vLLM defines cutlass_fp4_supported",
            id="no-definer-installed",
        ),
        pytest.param(
            fork(FROM_QUANT_UTILS + ", scaled_quantize"),
            LAYOUT_016,
            "split the import first",
            id="imported-with-other-names",
        ),
        pytest.param(
            fork(f"{FROM_QUANT_UTILS}\n{FROM_RELATIVE}"),
            LAYOUT_016,
            "found 2 times",
            id="wrong-import-twice",
        ),
        pytest.param(STOCK, LAYOUT_016, "not found", id="stock-has-no-import"),
    ],
)
def test_drift(source, layout, message, tmp_path):
    assert message in tools.check_drift(source, spec=SPEC, tmp_path=tmp_path, package_files=layout)


def test_is_applied_only_when_every_import_names_a_definer(fake_package):
    package = fake_package(LAYOUT_016)
    wrong = fork(FROM_QUANT_UTILS)
    mixed = fork(f"{FROM_NVFP4_UTILS}\n{FROM_RELATIVE}")
    assert not is_applied(wrong, package)
    assert not is_applied(mixed, package)
    assert is_applied(wrong, fake_package(LAYOUT_015, "site-0.15"))  # right for a 0.15 tree


@pytest.mark.parametrize(
    "module, level, expected",
    [
        pytest.param("vllm.x.y", 0, "vllm.x.y", id="absolute"),
        pytest.param("utils.quant_utils", 1, "vllm.model_executor.layers.quantization.utils.quant_utils", id="one-dot"),
        pytest.param("fused_moe", 2, "vllm.model_executor.layers.fused_moe", id="two-dots"),
        pytest.param(None, 1, "vllm.model_executor.layers.quantization", id="from-dot-import"),
    ],
)
def test_relative_imports_resolve_from_mxfp4(module, level, expected):
    assert absolute_module(module, level) == expected


def test_status_says_stock_never_imports_it(tmp_path):
    state, reason = status_on_fake_site(tmp_path / "venv", "0.17.1")[SPEC.id]
    assert state == "not-needed" and "stock vLLM never does" in reason
    assert "Stock vLLM has no such import" in listed(SPEC.id)


RELEASES = [pytest.param(str(v), id=f"vllm-{v}") for v in KNOWN_RELEASES]


@pytest.mark.upstream
@pytest.mark.parametrize("version", RELEASES)
def test_the_defining_module_on_the_real_wheel(version):
    expected, other = (QUANT_UTILS, NVFP4_UTILS) if Version(version) < Version("0.16.0") else (NVFP4_UTILS, QUANT_UTILS)
    assert "\ndef cutlass_fp4_supported(" in wheel_source(version, f"vllm/{expected}")
    assert "\ndef cutlass_fp4_supported(" not in (wheel_source(version, f"vllm/{other}") or "")
    assert "cutlass_fp4_supported" not in wheel_source(version, f"vllm/{TARGET}")
