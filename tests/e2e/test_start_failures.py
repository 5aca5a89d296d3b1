"""What `gptoss-patch serve` reports from a real vLLM's log: the MoE backend it chose, and why a start failed.

Every wait is bounded (tests/support/servers.py); a server that does not come up ends the test with
its log's last lines, never a hang.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from gptoss_patch.vocab import venv_dir
from tests.support import servers

VERSION = "0.17.1"


def test_the_sentinel_reports_the_moe_backend_from_the_startup_log(clone, model: Path, tmp_path: Path) -> None:
    python = clone(VERSION)
    with servers.running(python, model, tmp_path, launcher_args=("--allow-unpatched",)) as server:
        log = server.log_text()

    assert "Using CPU backend for Unquantized MoE" in log  # vLLM's own line...
    assert "MoE backend: CPU" in log  # ...recognised by the launcher while vLLM started


def test_a_bad_flag_value_ends_with_vllms_last_lines(clone, model: Path, tmp_path: Path) -> None:
    python = clone(VERSION)
    code, log = servers.start_and_wait_exit(python, model, tmp_path, "--max-model-len", "many",
                                            launcher_args=("--allow-unpatched",))

    assert code != 0
    assert "vLLM crashed (exit code" in log
    report = log[log.index("vLLM crashed"):]
    assert "--max-model-len" in report and "many" in report  # vLLM's own argparse line, quoted back


def test_a_vocabulary_lost_after_the_pre_flight_is_diagnosed_as_g01(clone, model: Path, tmp_path: Path) -> None:
    """The pre-flight checks the vocabulary; here it disappears while vLLM loads, as on a wiped /tmp."""
    python = clone(VERSION)
    vocab = tmp_path / "vocab"
    shutil.copytree(venv_dir(Path(python).parent.parent), vocab)
    env = {"TIKTOKEN_ENCODINGS_BASE": str(vocab), "TIKTOKEN_RS_CACHE_DIR": str(vocab)}
    server = servers.spawn(python, model, tmp_path / "logs", env=env, launcher_args=("--allow-unpatched",))
    try:
        deadline = time.monotonic() + 60
        while "Started vLLM (pid" not in server.log_text() and time.monotonic() < deadline:
            assert server.process.poll() is None, server.tail()
            time.sleep(0.2)
        shutil.rmtree(vocab)  # vLLM reads it only when its chat server initialises, ~10 s later
        code = server.process.wait(timeout=servers.READY_TIMEOUT)
    finally:
        servers.stop(server.process)
    text = server.log_text()

    assert code != 0, text[-3000:]
    assert "this matches known issue G01" in text, text[-3000:]
    assert "gptoss-patch vocab install" in text
