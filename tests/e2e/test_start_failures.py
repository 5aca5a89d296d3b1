"""What `gptoss-patch serve` reports from a real vLLM's log: the MoE backend it chose, and why a start failed.

Every wait is bounded (tests/support/servers.py); a server that does not come up ends the test with
its log's last lines, never a hang. The backend is read from the startup log of the session's shared
STOCK_0171 server (tests/e2e/conftest.py); the failing starts are this module's own, from its stock clone
(`stock_0171`: they change nothing in it).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from gptoss_patch.vocab import venv_dir
from tests.e2e.conftest import STOCK_0171
from tests.support import servers

VERSION = "0.17.1"


def shared_servers(item: pytest.Item, memo: object) -> tuple[servers.Spec, ...]:
    """STOCK_0171 for the test that reads its startup log."""
    return (STOCK_0171,) if getattr(item, "originalname", "") == "test_the_sentinel_reports_the_moe_backend_from_the_startup_log" else ()


def test_the_sentinel_reports_the_moe_backend_from_the_startup_log(shared: servers.Pool) -> None:
    assert STOCK_0171.version == VERSION and STOCK_0171.patches == ()
    (server,) = shared.get(STOCK_0171)
    log = server.log_text()

    assert "Using CPU backend for Unquantized MoE" in log  # vLLM's own line...
    assert "MoE backend: CPU" in log  # ...recognised by the launcher while vLLM started


def test_a_bad_flag_value_ends_with_vllms_last_lines(stock_0171: Path, model: Path, tmp_path: Path) -> None:
    python = stock_0171
    code, log = servers.start_and_wait_exit(python, model, tmp_path, "--max-model-len", "many",
                                            launcher_args=("--allow-unpatched",))

    assert code != 0
    assert "vLLM crashed (exit code" in log
    report = log[log.index("vLLM crashed"):]
    assert "--max-model-len" in report and "many" in report  # vLLM's own argparse line, quoted back


def test_a_vocabulary_lost_after_the_pre_flight_is_diagnosed_as_g01(stock_0171: Path, model: Path, tmp_path: Path) -> None:
    """The pre-flight checks the vocabulary; here it disappears while vLLM loads, as on a wiped /tmp."""
    python = stock_0171
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
