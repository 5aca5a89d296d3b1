"""The package's shape, as docs/development.md draws it: no import cycle, and the stdlib-only files stay so.

The import graph is read from the source (every import: module level, inside functions, and under
TYPE_CHECKING), so a cycle that only typing or a lazy import would close is caught too. Importing
`a.b.c` from outside `a` runs `a` and `a.b` first, so those count as edges as well.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import gptoss_patch
from tests.support import module_table

PACKAGE = Path(gptoss_patch.__file__).parent
STDLIB_ONLY = (  # they run where gptoss-patch is not installed (site-packages of vLLM, target interpreters)
    PACKAGE / "hook" / "plugin.py",
    *sorted((PACKAGE / "verify" / "probes").glob("*.py")),
)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(path: Path, package: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in imported_names(path, package):
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            parts = imported.split(".") if imported else []
            for depth in range(1, len(parts) + 1):
                ancestor = ".".join(parts[:depth])
                if ancestor in known and ancestor != name and not name.startswith(ancestor + "."):
                    graph[name].add(ancestor)
    return graph


def cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth-first)."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycle_even_for_typing_or_lazy_imports():
    graph = import_graph()
    cycles = [cycle for name in sorted(graph) if (cycle := cycle_from(name, graph))]
    assert cycles == [], " -> ".join(cycles[0])


def test_the_plugin_and_the_probe_scripts_import_only_the_standard_library():
    local = {path.stem for path in STDLIB_ONLY}  # the probe scripts import each other as top-level modules
    for path in STDLIB_ONLY:
        tops = {name.split(".")[0] for name in _module_level_imports(path)}
        foreign = tops - set(sys.stdlib_module_names) - local - {"__future__"}
        if path.parent.name == "probes" and path.name == "__init__.py":
            foreign -= {"gptoss_patch"}  # the package marker, imported by gptoss-patch only, never run there
        assert foreign == set(), f"{path.relative_to(PACKAGE)} imports {sorted(foreign)} at module level"


def _module_level_imports(path: Path) -> Iterator[str]:
    """Imports a script runs when loaded: its top level (a function may import vLLM, torch or harmony)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module or ""


def test_the_module_to_tests_table_names_every_module_and_only_existing_test_files():
    """docs/development.md maps each source module to its tests; a new module or a moved test file must update it."""
    root = PACKAGE.parent.parent
    rows = module_table.rows(root)
    listed = {name for modules, _ in rows for name in modules}
    tests = {name for _, files in rows for name in files}
    wanted = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "probes" not in p.parts}
    assert sorted(wanted - listed) == [], "modules missing from the table"
    assert sorted(listed - wanted) == [], "the table names modules that do not exist"
    assert sorted(t for t in tests if not (root / t).is_file()) == [], "the table names test files that do not exist"


def test_make_test_changed_selects_the_tests_of_a_changed_module_a_support_module_and_a_test():
    import importlib.util

    spec = importlib.util.spec_from_file_location("changed_tests", PACKAGE.parent.parent / "scripts" / "changed_tests.py")
    assert spec is not None and spec.loader is not None
    changed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(changed)

    assert changed.selected(["src/gptoss_patch/vocab.py"]) == module_table.tests_of("vocab.py") == ["tests/test_vocab.py"]
    assert "tests/test_artefacts.py" in changed.selected(["tests/support/ranged.py"])  # it imports the support module
    assert changed.selected(["tests/test_versions.py", "README.md"]) == ["tests/test_versions.py"]


# Issue 35, item 4: code runs in a target interpreter through target.call only (a timeout always, one framing of the
# answer, one error). The modules below start other processes themselves, each for the reason given; any other module
# that starts a process is a new way to run code, and fails here.
SPAWNERS = {
    "target.py": "target.call: code run in the target interpreter",
    "wheels.py": "pip download (an installer, not code that answers)",
    "provision/installers.py": "pip, uv and `python -m venv` (installers, not code that answers)",
    "launcher/runner.py": "vLLM servers and the bench driver: long-running, supervised, stopped with their process group",
    "launcher/gpus.py": "nvidia-smi: the one reader of this host's GPUs (issue 35, item 2)",
    "hook/plugin.py": "mode apply's `gptoss-patch apply` (stdlib only: it runs inside vLLM)",
}
_STARTS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
_OS_STARTS = {"system", "popen", "spawnv", "spawnve", "spawnl", "spawnlp", "spawnvp", "posix_spawn", "posix_spawnp"}
_NAMED_STARTS = {("subprocess", name) for name in _STARTS} | {("os", name) for name in _OS_STARTS}


def _starts_processes(path: Path) -> bool:
    """Whether the module names a way to start a process (subprocess.run, a Popen, os.system ...) outside annotations."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    annotations = {
        id(inner)
        for node in ast.walk(tree)
        for note in ([node.annotation] if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation else [])
        + ([node.returns] if isinstance(node, ast.FunctionDef) and node.returns else [])
        for inner in ast.walk(note)
    }
    for node in ast.walk(tree):
        named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and id(node) not in annotations
        if named and (node.value.id, node.attr) in _NAMED_STARTS:
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "subprocess" and {a.name for a in node.names} & _STARTS:
            return True
    return False


def test_only_the_listed_modules_start_processes_and_code_in_a_target_runs_through_target_call():
    found = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if _starts_processes(path)}
    assert sorted(found - set(SPAWNERS)) == [], "run it through target.call (or, for an installer, list it in SPAWNERS)"
    assert sorted(set(SPAWNERS) - found) == [], "SPAWNERS names a module that starts no process any more"


def test_the_scripts_run_in_a_target_frame_their_answer_as_target_call_reads_it():
    from gptoss_patch import target
    from gptoss_patch.verify.probes import MARKER

    for script in ("model/build_random.py", "numerics/kernel_check.py"):
        assert f'ANSWER = "{target.ANSWER}"' in (PACKAGE / script).read_text(encoding="utf-8"), script
    assert MARKER == target.ANSWER


# Issue 35, item 2: a pre-flight check is a launcher function `check_*(plan)` returning its rows, listed in the one
# ordered tuple launcher/checks.py runs for every launch command; one written anywhere else is never run by some of them.
def test_every_check_of_the_launcher_is_in_the_one_ordered_tuple_and_takes_the_plan() -> None:
    import inspect

    from gptoss_patch.launcher import checks

    defined = set()
    for path in sorted((PACKAGE / "launcher").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("check_") and [a.arg for a in node.args.args] == ["plan"]:
                defined.add(f"{path.stem}.{node.name}")
    listed = [f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}" for fn in checks.CHECKS]
    assert len(listed) == len(set(listed)), "a check listed twice runs twice"
    assert sorted(defined - set(listed)) == [], "add these to launcher/checks.py's CHECKS, where the reader meets them"
    assert all(list(inspect.signature(fn).parameters) == ["plan"] for fn in checks.CHECKS)
    assert all(name.split(".")[1].startswith("check_") for name in listed)


# Issue 35, item 5: the tests share only tests/support and conftest fixtures. A helper imported from another test
# module runs that module's collection-time code and ties the two files together; it belongs in tests/support.
def _imports_a_test_module(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).with_suffix("").parts
    package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
    names = imported_names(path, package)
    return any(name.startswith("tests.") and any(p.startswith("test_") for p in name.split(".")) for name in names)


def test_no_test_module_imports_from_another_test_module():
    root = PACKAGE.parent.parent
    found = [str(p.relative_to(root)) for p in sorted((root / "tests").rglob("*.py")) if _imports_a_test_module(p, root)]
    assert found == [], "move what they import from tests/**/test_*.py into a tests/support module"
