"""The codemod base class every patch builds on (imported only when a file must be transformed).

Codemods are plain `libcst.CSTTransformer`s matched with the small helpers below rather than
`libcst.matchers`/`libcst.codemod`: importing those two costs 0.5 s, more than parsing every target
file, and `apply` must stay within 1.25x of "import libcst + parse + regenerate" (bench/bench_apply.py).
"""

from __future__ import annotations

import libcst as cst

from gptoss_patch.spec import PackageView

_EMPTY = cst.Module(body=[])


class Drift(Exception):
    """The unpatched shape the codemod expects is not in the file (or not exactly once)."""


class PatchCodemod(cst.CSTTransformer):
    """Counts its rewrites; zero on an in-range target is drift, never a silent no-op."""

    EXPECTED_HITS = 1
    ANCHOR = "the code this patch rewrites"  # named in drift messages
    HELPER_SOURCE = ""  # module-level code the rewrite calls, appended to the module by finish()

    def __init__(self, package: PackageView) -> None:
        super().__init__()
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
            members = [new for member in statement.body.body for new in self._visit_member(member)]
            return [statement.with_changes(body=statement.body.with_changes(body=members))]
        return _flatten(statement.visit(self))

    def _visit_member(self, member: cst.BaseStatement) -> list[cst.BaseStatement]:
        return _flatten(member.visit(self)) if self.member_in_scope(member) else [member]


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


def defines(statement: cst.BaseStatement, name: str) -> bool:
    """A `def name` or `class name` statement."""
    return isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.name.value == name


def class_has_method(statement: cst.BaseStatement, name: str) -> bool:
    return isinstance(statement, cst.ClassDef) and any(defines(m, name) for m in statement.body.body)


def small_statement(statement: cst.BaseStatement) -> cst.BaseSmallStatement | None:
    """The only small statement of a simple line (`x = f()`), else None."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement.body[0]
    return None


def parse_statements(source: str, blank_lines_before: int = 0) -> list[cst.BaseStatement]:
    """Statements of `source` with their comments kept as leading lines.

    A module's first comment would become its header, so parse behind a placeholder statement.
    """
    body = list(cst.parse_module("pass\n" + source.strip("\n") + "\n").body[1:])
    first = body[0]
    empty = [cst.EmptyLine()] * blank_lines_before
    return [first.with_changes(leading_lines=[*empty, *first.leading_lines]), *body[1:]]
