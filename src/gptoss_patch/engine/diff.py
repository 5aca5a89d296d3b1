"""What `diff` and `apply --dry-run` print: a unified diff per file, in the form `git apply -p1` takes."""

from __future__ import annotations

import difflib

from gptoss_patch.engine.context import decode


def unified_diff(rel: str, before: bytes, after: bytes, context: int = 3) -> str:
    """A diff `git apply -p1` accepts from the site-packages directory (with `context` 0: `--unidiff-zero`)."""
    old = (decode(before) or "").splitlines(keepends=True)
    new = (decode(after) or "").splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(old, new, fromfile=f"a/{rel}", tofile=f"b/{rel}", n=context):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def creation_diff(rel: str, data: bytes) -> str:
    """A new file as git writes it (`git apply -p1` creates it from site-packages)."""
    body = unified_diff(rel, b"", data).split("\n", 2)[2]  # the hunks, without difflib's ---/+++ lines
    return f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n--- /dev/null\n+++ b/{rel}\n{body}"
