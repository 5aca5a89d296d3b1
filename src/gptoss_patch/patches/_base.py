"""The codemod base class every patch builds on (imported only when a file must be transformed)."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand

from gptoss_patch.spec import PackageView

PACKAGE_KEY = "gptoss_patch.package"


class Drift(Exception):
    """The unpatched shape the codemod expects is not in the file (or not exactly once)."""


class PatchCodemod(VisitorBasedCodemodCommand):
    """Counts its rewrites; zero on an in-range target is drift, never a silent no-op."""

    EXPECTED_HITS = 1
    ANCHOR = "the code this patch rewrites"  # named in drift messages

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.hits = 0

    @property
    def package(self) -> PackageView:
        return self.context.scratch[PACKAGE_KEY]

    def hit(self) -> None:
        self.hits += 1

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        result = super().transform_module_impl(tree)
        if self.hits != self.EXPECTED_HITS:
            found = "not found" if self.hits == 0 else f"found {self.hits} times"
            raise Drift(f"{self.ANCHOR}: {found}")
        return result


def run_codemod(codemod_class: type[PatchCodemod], source: str, package: PackageView) -> str:
    """Apply one codemod to `source`; raises Drift when its anchor is missing."""
    context = CodemodContext(scratch={PACKAGE_KEY: package})
    tree = cst.parse_module(source)
    return codemod_class(context).transform_module(tree).code


def parse_statements(code: str, blank_lines_before: int = 0) -> list[cst.BaseStatement]:
    """Statements of `code` with their comments kept as leading lines.

    A module's first comment would become its header, so parse behind a placeholder statement.
    """
    body = list(cst.parse_module("pass\n" + code.strip("\n") + "\n").body[1:])
    first = body[0]
    empty = [cst.EmptyLine()] * blank_lines_before
    return [first.with_changes(leading_lines=[*empty, *first.leading_lines]), *body[1:]]

