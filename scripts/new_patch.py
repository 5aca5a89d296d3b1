"""Scaffold a new patch: its module, dossier, test file, a catalogue row and a CHANGELOG entry.

    .venv/bin/python scripts/new_patch.py ID [--root DIR]

ID is the patch id, which is also its module's name: lower_snake_case, starting with a letter. The
files are placeholders to fill in (docs/adding-a-patch.md walks through each): the module imports
and registers at once, its band matches no release until you set it, and the test file fails until
its placeholders are replaced. A bad or existing id is refused in one line with exit code 2, and
nothing is written: every check runs, and every file is composed, before the first write.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ID_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
MAX_ID_LENGTH = 48  # ids appear in status tables, file names and the ledger
UNRELEASED = "## [Unreleased]\n"
ADDED = "### Added\n"
CATALOGUE_ROW = "| [`"  # how each row of the table in patches/README.md starts
EXIT_BAD_INPUT = 2


class Refused(Exception):
    """Bad input: one line for the user, and nothing written."""


@dataclass(frozen=True)
class Layout:
    """Where each piece of a patch lives in a checkout at `root`."""

    root: Path
    patch_id: str

    @property
    def module(self) -> Path:
        return self.root / "src" / "gptoss_patch" / "patches" / f"{self.patch_id}.py"

    @property
    def dossier(self) -> Path:
        return self.root / "patches" / self.patch_id / "README.md"

    @property
    def test_file(self) -> Path:
        return self.root / "tests" / "patches" / f"test_{self.patch_id}.py"

    @property
    def probe(self) -> Path:
        return self.root / "src" / "gptoss_patch" / "verify" / "probes" / f"probe_{self.patch_id}.py"

    @property
    def catalogue(self) -> Path:
        return self.root / "patches" / "README.md"

    @property
    def changelog(self) -> Path:
        return self.root / "CHANGELOG.md"

    def new_files(self) -> list[Path]:
        return [self.module, self.dossier, self.test_file]

    def existing_pieces(self) -> list[Path]:
        return [p for p in (*self.new_files(), self.dossier.parent, self.probe) if p.exists()]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        written = scaffold(Layout(args.root.resolve(), args.id))
    except Refused as exc:
        print(f"new_patch: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path in written:
        print(f"wrote {path}")
    print("next: docs/adding-a-patch.md")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="new_patch", description="Scaffold a new gptoss-patch patch.")
    parser.add_argument("id", help="the patch id and module name, e.g. harmony_tool_names")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to write into (default: this one)")
    return parser


def scaffold(layout: Layout) -> list[Path]:
    """Check everything first, compose every file in memory, then write them all."""
    _check_id(layout.patch_id)
    _check_checkout(layout)
    contents = {
        layout.module: module_text(layout.patch_id),
        layout.dossier: dossier_text(layout.patch_id),
        layout.test_file: test_text(layout.patch_id),
        layout.catalogue: with_catalogue_row(layout.catalogue.read_text(encoding="utf-8"), layout.patch_id),
        layout.changelog: with_changelog_entry(layout.changelog.read_text(encoding="utf-8"), layout.patch_id),
    }
    for path, text in contents.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(contents)


def _check_id(patch_id: str) -> None:
    if not ID_PATTERN.fullmatch(patch_id) or keyword.iskeyword(patch_id) or len(patch_id) > MAX_ID_LENGTH:
        raise Refused(
            f"bad patch id {patch_id!r}: lower_snake_case (letters, digits, underscores), starting with a letter, "
            f"at most {MAX_ID_LENGTH} characters, not a Python keyword"
        )


def _check_checkout(layout: Layout) -> None:
    if not (layout.module.parent.is_dir() and layout.catalogue.is_file() and layout.changelog.is_file()):
        needed = "src/gptoss_patch/patches, patches/README.md, CHANGELOG.md"
        raise Refused(f"{layout.root} is not a gptoss-patch checkout (no {needed})")
    existing = layout.existing_pieces()
    if existing:
        raise Refused(f"patch id {layout.patch_id!r} exists already: {existing[0].relative_to(layout.root)}")


def with_catalogue_row(text: str, patch_id: str) -> str:
    """patches/README.md with a row for the new patch after the last row of its catalogue table."""
    lines = text.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if line.startswith(CATALOGUE_ROW)]
    if not rows:
        raise Refused("patches/README.md has no catalogue table to add a row to")
    row = f"| [`{patch_id}`]({patch_id}/README.md) | vllm | TODO: range and target | TODO | TODO: summary |\n"
    return "".join([*lines[: rows[-1] + 1], row, *lines[rows[-1] + 1 :]])


def with_changelog_entry(text: str, patch_id: str) -> str:
    """CHANGELOG.md with an entry for the patch under [Unreleased] / Added (the heading made if missing)."""
    start = text.find(UNRELEASED)
    if start < 0:
        raise Refused("CHANGELOG.md has no `## [Unreleased]` section to add the patch to")
    body = start + len(UNRELEASED)
    end = text.find("\n## ", body)
    section = text[body : end if end >= 0 else len(text)]
    entry = f"- Patch `{patch_id}`: TODO: what users get, and on which vLLM releases.\n"
    added = section.find(ADDED)
    if added >= 0:
        at = body + added + len(ADDED)
        return text[:at] + entry + text[at:]
    return text[:body] + "\n" + ADDED + entry + text[body:]


def class_name(patch_id: str) -> str:
    return "".join(part.capitalize() for part in patch_id.split("_"))


def module_text(patch_id: str) -> str:
    return f'''"""TODO: one line: what this patch makes vLLM do for gpt-oss (and the known issue, docs/known-issues.md).

TODO: the bug as users meet it, where vLLM's code goes wrong, and the upstream fix if there is one.
Reports: TODO (issue and pull request links)
"""

from typing import TYPE_CHECKING

from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

TARGET = "TODO/module.py"  # the file this patch rewrites, relative to the installed vllm package


def codemod() -> "type[PatchCodemod]":
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod

    class {class_name(patch_id)}(PatchCodemod):
        ANCHOR = "TODO: the code this patch rewrites, as drift messages should name it"

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            return True  # TODO: only the function or class that holds the anchor (speed: see _base.py)

        # TODO: a leave_<StatementType>(self, original, updated) hook that rewrites the anchor and calls self.hit()

    return {class_name(patch_id)}


def is_applied(source: str, package: PackageView) -> bool:
    """TODO: whether `source` has the patched shape (text in: `status` must not need libcst)."""
    return False


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="TODO: what users get, in one sentence.",
    upstream=("TODO: https://github.com/vllm-project/vllm/issues/...",),
    bands=(Band("<0", TARGET),),  # TODO: the releases that have TARGET ("<0" matches none until you set it)
    codemod=codemod,
    is_applied=is_applied,
)
'''


def dossier_text(patch_id: str) -> str:
    return f"""# {patch_id}

TODO: one paragraph: what the patch changes, for whom.

## Why

TODO: the bug, in users' words, and why a patch (rather than a setting) is the fix.

## Upstream

- TODO: the issue, the pull request, the first release with the fix (or "no fix as of 0.33.0")

## Exact symptom

TODO: the error or the wrong output, verbatim.

## What the patch does

TODO: the statement it rewrites, before and after, and any helper it appends.

## Version range (verified on the wheels)

| vLLM | where the code is | verdict |
|---|---|---|
| TODO | TODO | TODO |

## Removal condition

TODO: when this patch can be deleted.
"""


def test_text(patch_id: str) -> str:
    return f'''"""{patch_id}: TODO: the behaviour these tests pin, in one line.

Snippets are hand-written in the shape of the upstream code (never copied from vLLM): just the
statements the codemod anchors on.
"""

from __future__ import annotations

from functools import partial

from gptoss_patch.patches.{patch_id} import SPEC
from tests.support import tools

check = partial(tools.check_transformed, spec=SPEC)
check_drift = partial(tools.check_drift, spec=SPEC)

BEFORE = """\\
TODO: the unpatched shape
"""
AFTER = """\\
TODO: the patched shape
"""


def test_rewrites_the_anchor():
    check(BEFORE, AFTER)


def test_drift_when_the_anchor_is_gone():
    assert "not found" in check_drift("x = 1\\n")


# The version gate at every edge the SPEC declares and the verdict on every release's real wheel are generated
# for every patch from its SPEC (tests/patches/test_verdicts.py): declare the bands and fixed_in right.
'''


if __name__ == "__main__":
    raise SystemExit(main())
