"""`apply --with-diff`: a user's unified diff (e.g. a fork's mxfp4 mods), applied in memory first.

The diff is checked and applied with `git apply` (through gitpython) in a scratch copy of the files
it touches, so nothing in site-packages changes unless the diff and every codemod succeed.
Paths in the diff are relative to site-packages (`a/vllm/...`, as `git diff` in a vLLM checkout
writes them), i.e. it applies with `git apply -p1` from the site-packages directory.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path, PurePosixPath

from gptoss_patch.errors import PatchFailed, UsageError, cause, detail_of
from gptoss_patch.target import Installation

_HEADER = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.MULTILINE)


def touched_files(diff_text: str) -> list[str]:
    """Site-packages-relative files a diff changes; it may not create, delete or leave the package."""
    paths = sorted({m.group(1) for m in _HEADER.finditer(diff_text)})
    if not paths:
        raise UsageError("the diff names no files (expected `--- a/vllm/...` / `+++ b/vllm/...` headers)")
    if "/dev/null" in paths:
        raise UsageError("the diff creates or deletes files; only changes to existing vllm files are supported")
    for rel in paths:
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or pure.parts[:1] != ("vllm",):
            raise UsageError(f"the diff touches {rel!r}, which is not a file of the vllm package (paths must be a/vllm/...)")
    return paths


def apply_all(
    inst: Installation, diff_paths: list[Path], start: dict[str, bytes] | None = None
) -> tuple[dict[str, bytes], dict[str, list[bytes]]]:
    """Apply the diffs in order to scratch copies (of `start`, else the files on disk); return the new
    bytes and each file's diff texts."""
    texts = [_read(p) for p in diff_paths]
    overlay: dict[str, bytes] = dict(start or {})
    blobs: dict[str, list[bytes]] = {}
    for path, text in zip(diff_paths, texts):
        rels = touched_files(text)
        current = {rel: overlay.get(rel) or _original(inst, rel) for rel in rels}
        overlay.update(_git_apply(path.name, text, current))
        for rel in rels:
            blobs.setdefault(rel, []).append(text.encode())
    return overlay, blobs


def replay(rel: str, original: bytes, diff_texts: list[bytes]) -> bytes:
    """Re-apply recorded diffs to a file's original (used when reverting some of its patches)."""
    data = original
    for text in diff_texts:
        try:
            data = git_apply(text.decode(), {rel: data}, include=rel).get(rel, data)
        except DoesNotApply as exc:
            raise PatchFailed(f"a recorded diff does not apply to {rel}: {exc}; nothing was written") from None
    return data


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read diff {path}: {cause(exc)}", detail=detail_of(exc)) from None


def _original(inst: Installation, rel: str) -> bytes:
    try:
        return (inst.site_packages / rel).read_bytes()
    except OSError:
        raise PatchFailed(f"the diff changes {rel}, which does not exist in vllm {inst.version}; nothing was written") from None


def _git_apply(name: str, diff_text: str, files: dict[str, bytes]) -> dict[str, bytes]:
    try:
        return git_apply(diff_text, files)
    except DoesNotApply as exc:
        raise PatchFailed(f"--with-diff {name} does not apply: {exc}; nothing was written") from None


class DoesNotApply(Exception):
    """`git apply` refused the diff; the message is git's first useful line (the first failing hunk)."""


def git_apply(
    diff_text: str, files: dict[str, bytes], *, reverse: bool = False, include: str | None = None, zero_context: bool = False,
    new: tuple[str, ...] = (),
) -> dict[str, bytes]:
    """Apply (or, reversed, take out) a diff to in-memory files, in a scratch directory; nothing else is touched.

    With `include`, only that file's part of the diff (a diff may change several files). `new`: files
    the diff creates (absent from `files`; their parent folders are made in the scratch copy)."""
    import git

    with tempfile.TemporaryDirectory(prefix="gptoss-patch-diff-") as scratch:
        root = Path(scratch)
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for rel in new:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / ".patch").write_text(diff_text, encoding="utf-8")
        runner = git.Git(str(root))
        flags = (["-R"] if reverse else []) + ([f"--include={include}"] if include else [])
        flags += ["--unidiff-zero"] if zero_context else []
        try:
            runner.apply("--check", "-p1", *flags, ".patch")
            runner.apply("-p1", *flags, ".patch")
        except git.GitCommandError as exc:
            raise DoesNotApply(_git_reason(str(exc.stderr))) from None
        return {rel: (root / rel).read_bytes() for rel in (*files, *new)}


def _git_reason(stderr: str) -> str:
    lines = [ln.strip().removeprefix("stderr:").strip().strip("'").strip() for ln in stderr.splitlines()]
    lines = [ln.removeprefix("error: ") for ln in lines if ln]
    failed = next((ln for ln in lines if ln.startswith("patch failed:")), None)
    return failed or (lines[-1] if lines else "git apply failed")
