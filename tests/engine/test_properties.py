"""Property tests (hypothesis): apply-then-revert restores the input byte for byte, and apply is idempotent.

Inputs are generated variations of the hand-written upstream-shaped snippets of tests/support/fakesite.py, in
ways the codemods claim to cope with (their matchers look at the syntax tree, not at trivia):
comments and blank lines anywhere, trailing whitespace, the indentation unit (2/4/8 spaces or tabs),
LF or CRLF line endings, an optional BOM, and renamed local names that no matcher anchors on. The
patches checked are the ones pending on the unvaried snippets, so new snippets join automatically.
The engine API runs on a plain temporary site-packages tree (no venv, no subprocess): fast.
"""

from __future__ import annotations

import re
import sys
import tempfile
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings, strategies as st
from packaging.version import Version

from gptoss_patch import engine
from gptoss_patch.engine.ledger import DIRNAME
from gptoss_patch.spec import Selection, State
from gptoss_patch.target import Installation
from tests.support import fakesite

VERSION = "0.17.1"
# Local names no matcher anchors on, per snippet (the codemods match `sys_msg`, `messages`, `request`,
# `should_include_tools` and `device` by name, so those stay).
FREE_NAMES = {
    fakesite.SERVING_REL: ("dev_msg",),
    fakesite.MARLIN_REL: ("m", "n", "k", "dtype"),
}
BOM = b"\xef\xbb\xbf"
COMMENT_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=24)
IDENTIFIER = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).map(lambda s: f"v_{s}")  # never a keyword
# 40 examples; 10 under `make check` (its hypothesis profile `check`, tests/conftest.py: the quick pass).
PROPERTY = settings(max_examples=min(40, settings.default.max_examples), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def build(root: Path, files: dict[str, bytes]) -> Installation:
    """site-packages with vllm (the fakesite files, `files` overriding) and a .dist-info with RECORD."""
    site = root / "site-packages"
    info = site / f"vllm-{VERSION}.dist-info"
    info.mkdir(parents=True)
    rows = []
    every = {rel: textwrap.dedent(text).encode() for rel, text in fakesite.FILES.items()} | files
    for rel, data in every.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        rows.append(fakesite.record_line(rel, data))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n")
    rows.append(fakesite.record_line(f"{info.name}/METADATA", (info / "METADATA").read_bytes()))
    (info / "RECORD").write_text("".join(rows) + f"{info.name}/RECORD,,\n")
    return Installation(sys.executable, Version(VERSION), site, info)


def pending_on_the_snippets() -> dict[str, str]:
    """patch id -> target file, for the patches pending on the unvaried snippets."""
    with tempfile.TemporaryDirectory() as tmp:
        report = engine.status(build(Path(tmp), {}))
    return {r.id: r.file for r in report.results if r.state is State.PENDING and r.file}


PENDING = pending_on_the_snippets()
TARGETS = sorted(set(PENDING.values()))


@st.composite
def variant(draw: st.DrawFn, rel: str) -> bytes:
    """One snippet with trivia, indentation, line endings, BOM and free local names varied."""
    text = textwrap.dedent(fakesite.FILES[rel])
    taken = set(re.findall(r"[A-Za-z_]\w*", text))
    free = [n for n in FREE_NAMES.get(rel, ()) if n in taken]
    if free:
        names = draw(st.lists(IDENTIFIER.filter(lambda s: s not in taken), min_size=len(free), max_size=len(free), unique=True))
        for old, new in zip(free, names):
            if draw(st.booleans()):
                text = re.sub(rf"\b{old}\b", new, text)
    unit = draw(st.sampled_from(["    ", "  ", "        ", "\t"]))
    lines = []
    for line in text.splitlines():
        for _ in range(draw(st.integers(0, 2))):  # blank or comment lines, at any indentation
            if draw(st.booleans()):
                lines.append("")
            else:
                lines.append(draw(st.sampled_from(["", unit, unit * 2, " "])) + "#" + draw(COMMENT_TEXT))
        body = line.lstrip(" ")
        depth = len(line) - len(body)
        trailing = draw(st.sampled_from(["", "", " ", "\t", "   "])) if body else ""
        lines.append(unit * (depth // 4) + " " * (depth % 4) + body + trailing)
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    data = (newline.join(lines) + newline).encode("utf-8")
    bom = draw(st.booleans())
    event(f"{rel.rsplit('/', 1)[1]}: {'CRLF' if newline == chr(13) + chr(10) else 'LF'}{' + BOM' if bom else ''}, indent {unit!r}")
    return (BOM if bom else b"") + data


def files_of(inst: Installation, rels: list[str]) -> dict[str, bytes]:
    return {rel: (inst.site_packages / rel).read_bytes() for rel in rels}


def test_the_snippets_have_patches_to_vary():
    assert PENDING, "no patch is pending on the fakesite snippets: the property tests would test nothing"


@PROPERTY
@given(st.fixed_dictionaries({rel: variant(rel) for rel in TARGETS}))
def test_apply_then_revert_restores_every_byte_and_apply_is_idempotent(varied: dict[str, bytes]):
    only = Selection(only=tuple(PENDING))
    with tempfile.TemporaryDirectory() as tmp:
        inst = build(Path(tmp) / "a", varied)
        record = inst.record.read_bytes()
        assert {r.id: r.state for r in engine.status(inst, only).results} == dict.fromkeys(PENDING, State.PENDING)

        first = engine.apply(inst, only)
        assert {r.id for r in first.results if r.changed} == set(PENDING)
        patched = files_of(inst, TARGETS)
        for rel, data in patched.items():
            assert data != varied[rel]
            assert data.startswith(BOM) == varied[rel].startswith(BOM)
            if b"\r\n" in varied[rel]:
                assert data.count(b"\n") == data.count(b"\r\n"), f"{rel}: line endings mixed by apply"
            compile(data.removeprefix(BOM), rel, "exec")

        # idempotent: a second apply writes nothing, not even the ledger
        ledger = (inst.dist_info / DIRNAME / "ledger.json").read_bytes()
        again = engine.apply(inst, only)
        assert not any(r.changed for r in again.results)
        assert all(r.state is State.APPLIED for r in again.results)
        assert files_of(inst, TARGETS) == patched and (inst.dist_info / DIRNAME / "ledger.json").read_bytes() == ledger

        # ... and recognised by shape alone, where no ledger says so (another copy with these bytes)
        other = build(Path(tmp) / "b", patched)
        shape = engine.apply(other, only)
        assert not any(r.changed for r in shape.results) and all(r.state is State.APPLIED for r in shape.results)
        assert files_of(other, TARGETS) == patched and not (other.dist_info / DIRNAME).exists()

        engine.revert(inst, only)
        assert files_of(inst, TARGETS) == varied
        assert inst.record.read_bytes() == record and not (inst.dist_info / DIRNAME).exists()


@PROPERTY
@given(st.fixed_dictionaries({rel: variant(rel) for rel in TARGETS}), st.data())
def test_reverting_one_patch_keeps_the_others_and_restores_its_file(varied: dict[str, bytes], data: st.DataObject):
    """Partial revert: the reverted patch's file goes back byte for byte; the rest stays patched."""
    dropped = data.draw(st.sampled_from(sorted(PENDING)))
    with tempfile.TemporaryDirectory() as tmp:
        inst = build(Path(tmp) / "a", varied)
        engine.apply(inst, Selection(only=tuple(PENDING)))
        patched = files_of(inst, TARGETS)
        engine.revert(inst, Selection(only=(dropped,)))
        states = {r.id: r.state for r in engine.status(inst, Selection(only=tuple(PENDING))).results}
        assert states == {i: State.PENDING if i == dropped else State.APPLIED for i in PENDING}
        target = PENDING[dropped]
        if all(PENDING[i] != target for i in PENDING if i != dropped):
            assert (inst.site_packages / target).read_bytes() == varied[target]
        assert all(files_of(inst, [rel])[rel] == patched[rel] for rel in TARGETS if rel != target)
        engine.revert(inst)
        assert files_of(inst, TARGETS) == varied and not (inst.dist_info / DIRNAME).exists()
