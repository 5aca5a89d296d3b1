"""Write tests/launcher/facts/VERSION.json: what the launcher reads from each vLLM release, for the pre-flight tests.

For every release in versions.KNOWN_RELEASES (or the ones named), the real static readers (launcher/static.py) and
the real engine (`status`, `apply`, `status`) run on the release's own files, read out of its wheel: the test cache's
slim copy (tests/support/artefacts.py: GPTOSS_PATCH_WHEEL_CACHE, default ~/.cache/gptoss-patch/wheels), read by HTTP
range requests where it is missing, each file checked against the wheel's RECORD. What is written is facts only
(env-var names, flags, backends, defaults, patch states) with the sha256 of every input file and of the reader's
source: no vLLM source text (tests/launcher/recorded.py).

    .venv/bin/python scripts/record_launch_facts.py [--check] [VERSION ...]

--check writes nothing and exits 1 when a committed file differs from what the wheels give.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptoss_patch.versions import KNOWN_RELEASES  # noqa: E402
from tests.launcher import recorded  # noqa: E402
from tests.support import artefacts  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    parser.add_argument("versions", nargs="*", help="releases to record (default: every known release)")
    args = parser.parse_args()
    versions = args.versions or [str(v) for v in KNOWN_RELEASES]
    stale = []
    for version in versions:
        try:
            text = recorded.dumps(recorded.record(version))
        except artefacts.MissingArtefact as exc:
            raise SystemExit(str(exc)) from None
        path = recorded.path_of(version)
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if args.check:
            if current != text:
                stale.append(version)
            continue
        path.parent.mkdir(exist_ok=True)
        if current != text:
            path.write_text(text, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {'unchanged' if current == text else 'written'}")
    if args.check:
        print(f"stale: {', '.join(stale)}; run {recorded.SCRIPT}" if stale else f"up to date: {len(versions)} releases")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
