"""The codemod base class every patch builds on (imported only when a file must be transformed).

A codemod is a statement-level transformer: `leave_<StatementType>(original, updated)` hooks (as in
libcst's CSTTransformer) called on the statements of its scope, matched with the small helpers below.
It does not use `libcst.matchers`/`libcst.codemod` (importing those costs 0.5 s, more than parsing
every target file) nor libcst's generic visitor, which would also visit every expression node of a
500-line method: `apply` must stay within 1.25x of "import libcst + parse + regenerate"
(bench/bench_apply.py).
"""

from __future__ import annotations

import functools

import libcst as cst

from gptoss_patch.spec import PackageView

_EMPTY = cst.Module(body=[])


class Drift(Exception):
    """The unpatched shape the codemod expects is not in the file (or not exactly once)."""


# Fields of compound statements that hold further statements (bodies, else/except/finally blocks).
_NESTED = ("body", "orelse", "handlers", "finalbody", "cases")


class PatchCodemod:
    """Counts its rewrites; zero on an in-range target is drift, never a silent no-op."""

    EXPECTED_HITS = 1
    ANCHOR = "the code this patch rewrites"  # named in drift messages
    HELPER_SOURCE = ""  # module-level code the rewrite calls, appended to the module by finish()

    def __init__(self, package: PackageView) -> None:
        self.package = package
        self.hits = 0

    def hit(self) -> None:
        self.hits += 1

    def in_scope(self, statement: cst.BaseStatement) -> bool:
        """Whether a top-level statement may hold the anchor. Narrow it: visiting one function
        instead of a 2,000-line module is what keeps `apply` near the cost of a bare parse."""
        return True

    def member_in_scope(self, member: cst.BaseStatement) -> bool:
        """Within an in-scope class, whether a member may hold the anchor."""
        return True

    def finish(self, module: cst.Module) -> cst.Module:
        """After the rewrite: append HELPER_SOURCE (called only when the hit count is right)."""
        if not self.HELPER_SOURCE:
            return module
        return module.with_changes(body=[*module.body, *parse_statements(self.HELPER_SOURCE, blank_lines_before=2)])

    def rewrite(self, tree: cst.Module) -> cst.Module:
        body = [new for statement in tree.body for new in self._visit_top(statement)]
        if self.hits != self.EXPECTED_HITS:
            found = "not found" if self.hits == 0 else f"found {self.hits} times"
            raise Drift(f"{self.ANCHOR}: {found}")
        return self.finish(tree.with_changes(body=body))

    def _visit_top(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        if not self.in_scope(statement):
            return [statement]
        if isinstance(statement, cst.ClassDef):
            members = [new for member in statement.body.body for new in self._visit_member(member)]  # type: ignore[arg-type]
            return [statement.with_changes(body=statement.body.with_changes(body=members))]
        return _flatten(self.walk(statement))

    def _visit_member(self, member: cst.BaseStatement) -> list[cst.BaseStatement]:
        return _flatten(self.walk(member)) if self.member_in_scope(member) else [member]

    def walk(self, node: cst.CSTNode) -> object:
        """Rewrite the statements inside `node` (innermost first; a simple line's small statements
        count as its body), then `node` through its `leave_<Type>` hook. Expressions are not visited."""
        changes = {f: new for f in _NESTED if (old := getattr(node, f, None)) is not None and (new := self._walk_field(old)) is not old}
        updated = node.with_changes(**changes) if changes else node
        hook = getattr(self, f"leave_{type(node).__name__}", None)
        return hook(node, updated) if hook else updated

    def _walk_field(self, value: object) -> object:
        if isinstance(value, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            body = [new for s in value.body for new in _flatten(self.walk(s))]
            unchanged = len(body) == len(value.body) and all(a is b for a, b in zip(body, value.body))
            return value if unchanged else value.with_changes(body=body)
        if isinstance(value, (list, tuple)):
            items = [self.walk(v) for v in value]
            return items if any(a is not b for a, b in zip(items, value)) else value
        if isinstance(value, cst.CSTNode):
            return self.walk(value)
        return value


def _flatten(node: object) -> list[cst.BaseStatement]:
    if isinstance(node, cst.RemovalSentinel):
        return []
    if isinstance(node, cst.FlattenSentinel):
        return list(node.nodes)
    return [node]  # type: ignore[list-item]


def run_codemod(codemod_class: type[PatchCodemod], source: str, package: PackageView) -> str:
    """Apply one codemod to `source`; raises Drift when its anchor is missing or ambiguous."""
    return codemod_class(package).rewrite(cst.parse_module(source)).code


# -- shape helpers (whitespace- and comment-insensitive) -------------------------------------------


def code(node: cst.CSTNode) -> str:
    """The node's source with all whitespace removed: `not  envs.X` and `not envs.X` compare equal."""
    return "".join(_EMPTY.code_for_node(node).split())


def defines(statement: cst.CSTNode, name: str) -> bool:
    """A `def name` or `class name` statement."""
    return isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.name.value == name


def class_has_method(statement: cst.BaseStatement, name: str) -> bool:
    return isinstance(statement, cst.ClassDef) and any(defines(m, name) for m in statement.body.body)


def small_statement(statement: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The only small statement of a simple line (`x = f()`), else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def parse_statements(source: str, blank_lines_before: int = 0) -> list[cst.BaseStatement]:
    """Statements of `source` with their comments kept as leading lines (parsed once per process:
    libcst nodes are immutable, so the dry run and the rewrite share them)."""
    return list(_parse_statements(source, blank_lines_before))


@functools.lru_cache(maxsize=64)
def _parse_statements(source: str, blank_lines_before: int) -> tuple[cst.BaseStatement, ...]:
    # A module's first comment would become its header, so parse behind a placeholder statement.
    body = list(cst.parse_module("pass\n" + source.strip("\n") + "\n").body[1:])
    first = body[0]
    empty = [cst.EmptyLine()] * blank_lines_before
    return (first.with_changes(leading_lines=[*empty, *first.leading_lines]), *body[1:])
