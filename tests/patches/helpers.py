"""Expected-output builders shared by the patch unit tests."""

from __future__ import annotations

import textwrap


def with_helper(source: str, helper_source: str) -> str:
    """`source` as a codemod leaves it: the patch's helper appended after two blank lines."""
    return textwrap.dedent(source) + "\n\n" + helper_source.lstrip("\n")


def wheel_source(version: str, relpath: str) -> str | None:
    """One file of the real vllm==version wheel (checked against its RECORD), or None if the wheel lacks it."""
    import zipfile

    from tests.upstream import read_from_wheel, sources_path

    with zipfile.ZipFile(sources_path(version)) as wheel:
        if relpath not in wheel.namelist():
            return None
    return read_from_wheel(version, relpath).decode()
