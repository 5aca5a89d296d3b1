"""Issue 12: `doctor` tells the truth. On the same broken (or healthy) setup, each of its checks agrees with
the command that would act on it: `executable` with `serve`, `vocab` with `vocab status`, `patches` with
`status` and `serve`. Each row: one setup, doctor's verdict for that check, and the command's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gptoss_patch import vocab
from tests.launcher.conftest import MODEL
from tests.launcher.installs import build_install
from tests.support.cli import run
from tests.support.servers import free_port

pytestmark = pytest.mark.upstream  # every case builds a real 0.17.1 install (build_install)

Setup = Callable[[Path, Path], dict[str, str]]  # (venv, tmp_path) -> extra environment


def doctor_verdict(venv: Path, env: dict[str, str], check: str) -> str:
    result = run("doctor", "--venv", str(venv), "--json", "--port", str(free_port()), env=env)
    assert result.exit_code in (0, 1), result.output
    return next(c["status"] for c in json.loads(result.stdout)["checks"] if c["name"] == check)


def serve_starts(venv: Path, env: dict[str, str]) -> bool:
    """`serve --dry-run` runs every refusal `serve` has (launchability, pre-flight) and starts nothing."""
    result = run("serve", MODEL, "--venv", str(venv), "--dry-run", "--port", str(free_port()), env=env)
    assert result.exit_code in (0, 1, 4), result.output
    return result.exit_code == 0


def vocab_for_serve(env: dict[str, str]) -> bool:
    result = run("vocab", "status", "--json", env=env)
    return bool(json.loads(result.stdout)["serve"]["ok"])


def patches_clean(venv: Path, env: dict[str, str]) -> bool:
    return run("status", "--venv", str(venv), env=env).exit_code == 0


# -- setups ----------------------------------------------------------------------------------------


def healthy(venv: Path, tmp: Path) -> dict[str, str]:
    return {}


def script_removed(venv: Path, tmp: Path) -> dict[str, str]:
    (venv / "bin" / "vllm").unlink()
    return {}


def script_interpreter_gone(venv: Path, tmp: Path) -> dict[str, str]:
    script = venv / "bin" / "vllm"
    script.unlink()
    script.write_text(f"#!{tmp / 'renamed-away' / 'bin' / 'python'}\nimport sys\n")
    script.chmod(0o755)
    return {}


def script_not_executable(venv: Path, tmp: Path) -> dict[str, str]:
    (venv / "bin" / "vllm").chmod(0o644)
    return {}


def vocab_base_empty(venv: Path, tmp: Path) -> dict[str, str]:
    (tmp / "empty-vocab").mkdir()
    return {"TIKTOKEN_ENCODINGS_BASE": str(tmp / "empty-vocab")}


def vocab_nowhere(venv: Path, tmp: Path) -> dict[str, str]:
    """No variable, nothing in gptoss-patch's directory nor harmony's default cache: serve would download."""
    (tmp / "tmpdir").mkdir()
    return {"XDG_CACHE_HOME": str(tmp / "empty-cache"), "TMPDIR": str(tmp / "tmpdir")}


def vocab_corrupt(venv: Path, tmp: Path) -> dict[str, str]:
    (tmp / "bad").mkdir()
    (tmp / "bad" / vocab.O200K.file_name).write_bytes(b"not the vocabulary\n")
    return {"TIKTOKEN_ENCODINGS_BASE": str(tmp / "bad")}


def vocab_only_in_gptoss_dir(venv: Path, tmp: Path) -> dict[str, str]:
    """Installed by `vocab install`, nothing exported: serve exports it, so both say ok for serve."""
    (tmp / "tmpdir").mkdir()
    return {"TMPDIR": str(tmp / "tmpdir")}


def vocab_rs_cache(venv: Path, tmp: Path) -> dict[str, str]:
    return {"TIKTOKEN_RS_CACHE_DIR": str(vocab.default_dir())}


def unpatched(venv: Path, tmp: Path) -> dict[str, str]:
    return {}


CASES: list[tuple[str, Setup, str, bool]] = [
    # (check, setup, doctor's verdict, what the command says)
    ("executable", healthy, "pass", True),
    ("executable", script_removed, "fail", False),
    ("executable", script_interpreter_gone, "fail", False),
    ("executable", script_not_executable, "fail", False),
    ("vocab", vocab_only_in_gptoss_dir, "pass", True),
    ("vocab", vocab_rs_cache, "pass", True),
    ("vocab", vocab_base_empty, "fail", False),
    ("vocab", vocab_nowhere, "fail", False),
    ("vocab", vocab_corrupt, "fail", False),
    ("patches", healthy, "pass", True),
    ("patches", unpatched, "fail", False),
]


@pytest.mark.parametrize(("check", "setup", "doctor_says", "command_says"), CASES, ids=[f"{c[0]}-{c[1].__name__}" for c in CASES])
def test_doctor_and_the_command_agree(
    tmp_path: Path, vocabulary: Path, check: str, setup: Setup, doctor_says: str, command_says: bool
) -> None:
    # `vocabulary`: gptoss-patch's own vocabulary installed, as a user's would be; the vocab setups take it away.
    venv = tmp_path / "venv"
    build_install(venv, "0.17.1", patched=setup is not unpatched)
    env = setup(venv, tmp_path)
    assert doctor_verdict(venv, env, check) == doctor_says
    if check == "executable":
        assert serve_starts(venv, env) is command_says
    elif check == "vocab":
        assert vocab_for_serve(env) is command_says
        assert serve_starts(venv, env) is command_says  # serve's pre-flight refuses a vocabulary doctor fails
    else:
        assert patches_clean(venv, env) is command_says
        assert serve_starts(venv, env) is command_says
