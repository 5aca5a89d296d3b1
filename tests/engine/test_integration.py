"""The whole cycle on the real vllm==0.17.1 wheel, installed --no-deps into a private venv."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_patch.engine.record import read_hashes
from gptoss_patch.fsutil import sha256
from tests.support.catalogue import stock_states
from tests.support.cli import run, states
from tests.support.upstream import replace_file, site_packages, wheel_path

pytestmark = pytest.mark.upstream
VERSION = "0.17.1"
SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
MARLIN = "vllm/model_executor/layers/quantization/utils/marlin_utils.py"
MXFP4 = "vllm/model_executor/layers/quantization/mxfp4.py"


def matches_record(venv: Path, *rels: str) -> bool:
    site = site_packages(venv)
    record = read_hashes(next(site.glob("vllm-*.dist-info")) / "RECORD")
    return all(sha256((site / rel).read_bytes()) == record[rel] for rel in rels)


def test_pending_apply_applied_idempotent_verify_revert(venv):
    site = site_packages(venv)
    record = next(site.glob("vllm-*.dist-info")) / "RECORD"
    record_bytes = record.read_bytes()
    assert states(venv) == stock_states(VERSION)

    assert run("apply", "--vllm", VERSION, venv=venv).exit_code == 0
    assert states(venv)["harmony_instructions"] == states(venv)["marlin_atomic_add_sm121"] == "applied"

    stamps = {rel: (site / rel).stat().st_mtime_ns for rel in (SERVING, MARLIN)}
    second = run("apply", "--vllm", VERSION, venv=venv)
    assert second.exit_code == 0 and "Patched" not in second.stderr
    assert {rel: (site / rel).stat().st_mtime_ns for rel in stamps} == stamps

    assert run("verify", venv=venv).exit_code == 0
    assert run("revert", venv=venv).exit_code == 0
    assert matches_record(venv, SERVING, MARLIN)
    assert record.read_bytes() == record_bytes


def test_outside_edit_is_modified_and_revert_needs_force(venv):
    run("apply", venv=venv)
    target = site_packages(venv) / MARLIN
    replace_file(target, target.read_bytes() + b"\n# hand edit\n")
    assert states(venv)["marlin_atomic_add_sm121"] == "modified"
    refused = run("revert", venv=venv)
    assert refused.exit_code == 5 and "changed after gptoss-patch wrote it" in refused.stderr
    assert run("revert", "--force", venv=venv).exit_code == 0
    assert matches_record(venv, SERVING, MARLIN)


def test_file_whose_anchor_is_gone_is_drifted_and_nothing_is_written(venv):
    target = site_packages(venv) / SERVING
    replace_file(target, target.read_bytes().replace(b"        messages.append(sys_msg)\n", b""))
    assert states(venv)["harmony_instructions"] == "drifted"
    result = run("apply", venv=venv)
    # A hand edit (the file is not what RECORD lists, and a patch of it drifts): refused, naming the file, with the
    # way to keep the edit (capture it) rather than a --skip that would leave it half patched.
    assert result.exit_code == 3 and f"{SERVING} is not the file vllm 0.17.1 installed" in result.stderr
    assert "capture NAME --dir DIR --files" in result.stderr
    assert matches_record(venv, MARLIN)


def fork_diff(venv: Path, old: bytes, new: bytes) -> str:
    """A fork-style diff (paths a/vllm/...) adding the import that breaks stock vLLM."""
    return "".join(
        difflib.unified_diff(old.decode().splitlines(True), new.decode().splitlines(True), f"a/{MXFP4}", f"b/{MXFP4}")
    )


def test_with_diff_applies_the_fork_diff_then_fixes_its_import(venv, tmp_path):
    site = site_packages(venv)
    original = (site / MXFP4).read_bytes()
    anchor = b"from vllm.utils.math_utils import round_up\n"
    wrong = b"from vllm.model_executor.layers.quantization.utils.quant_utils import cutlass_fp4_supported\n"
    patch = tmp_path / "mxfp4-mods.diff"
    patch.write_text(fork_diff(venv, original, original.replace(anchor, anchor + wrong)))

    result = run("apply", "--with-diff", str(patch), venv=venv)
    assert result.exit_code == 0, result.stderr
    text = (site / MXFP4).read_text()
    assert "from vllm.model_executor.layers.quantization.utils.nvfp4_utils import cutlass_fp4_supported" in text
    assert "quant_utils import cutlass_fp4_supported" not in text
    assert states(venv)["mxfp4_fp4_import"] == "applied"
    assert run("revert", venv=venv).exit_code == 0
    assert matches_record(venv, MXFP4, SERVING, MARLIN)


def test_with_diff_that_does_not_apply_writes_nothing(venv, tmp_path):
    patch = tmp_path / "stale.diff"
    patch.write_text(f"--- a/{MXFP4}\n+++ b/{MXFP4}\n@@ -1,1 +1,1 @@\n-no such line\n+something\n")
    result = run("apply", "--with-diff", str(patch), venv=venv)
    assert result.exit_code == 3
    assert result.stderr.startswith("error: --with-diff stale.diff does not apply: "), result.stderr
    assert matches_record(venv, MXFP4, SERVING, MARLIN)
    assert not any(site_packages(venv).glob("vllm-*.dist-info/gptoss_patch"))


def test_force_reinstall_is_never_reported_applied_from_a_stale_ledger(venv):
    run("apply", venv=venv)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps"]
    subprocess.run([*pip, "--force-reinstall", "--no-compile", str(wheel_path(VERSION))], check=True, capture_output=True)
    assert states(venv)["harmony_instructions"] == "pending"
    assert not any(site_packages(venv).glob("vllm-*.dist-info/gptoss_patch"))  # pip removed our ledger with vLLM
