"""Cheap shape detectors on source text (stdlib `ast` only), so `status` never needs libcst."""

from __future__ import annotations

import ast
from functools import lru_cache


@lru_cache(maxsize=16)
def parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _module_and_class_level(tree: ast.Module) -> list[ast.stmt]:
    members = [m for node in tree.body if isinstance(node, ast.ClassDef) for m in node.body]
    return [*tree.body, *members]


def functions(source: str, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and methods called `name` (no full walk: these files are large)."""
    tree = parse(source)
    if tree is None:
        return []
    return [
        n for n in _module_and_class_level(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
    ]


def top_level_function(source: str, name: str) -> bool:
    if f"def {name}(" not in source:  # the common "not patched" answer without parsing a large file
        return False
    tree = parse(source)
    return tree is not None and any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def calls(node: ast.AST, name: str) -> bool:
    """Whether `node` contains a call to the plain name `name`."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node)
    )


def imports_of(source: str, name: str) -> list[ast.ImportFrom]:
    """`from X import name` at module level, including under module-level `try:` and `if`."""
    if name not in source:  # most files never mention it: no need to parse them
        return []
    tree = parse(source)
    if tree is None:
        return []
    blocks = [n for n in tree.body if isinstance(n, (ast.Try, ast.If))]
    nested = [s for b in blocks for s in ast.walk(b) if isinstance(s, ast.ImportFrom)]
    top = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    return [n for n in [*top, *nested] if any(a.name == name for a in n.names)]
