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


def functions(source: str, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function (at any depth) called `name`."""
    tree = parse(source)
    if tree is None:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]


def top_level_function(source: str, name: str) -> bool:
    tree = parse(source)
    return tree is not None and any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def calls(node: ast.AST, name: str) -> bool:
    """Whether `node` contains a call to the plain name `name`."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node)
    )


def imports_of(source: str, name: str) -> list[ast.ImportFrom]:
    """`from X import name` statements anywhere in the module."""
    tree = parse(source)
    if tree is None:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and any(a.name == name for a in n.names)]
