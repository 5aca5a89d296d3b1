"""Write src/gptoss_patch/data/release_files.json: the evidence engine/releases.py recognises builds by.

For every release in versions.KNOWN_RELEASES, the sha256 of each file a patch band targets at that
release (`vllm/` + band.target, from the registry), read from the RECORD of the stock wheel: facts
only, no vLLM source, and nothing is extracted. The wheels' sources come from the test cache (tests/support/artefacts.py:
GPTOSS_PATCH_WHEEL_CACHE, default ~/.cache/gptoss-patch/wheels), read by range requests when missing.

    .venv/bin/python scripts/release_hashes.py [--check]

--check writes nothing and exits 1 when the shipped file differs from what the wheels say.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packaging.version import Version  # noqa: E402

from gptoss_patch.engine import releases  # noqa: E402
from gptoss_patch.registry import all_specs  # noqa: E402
from gptoss_patch.versions import KNOWN_RELEASES  # noqa: E402
from tests.support import artefacts  # noqa: E402
from tests.support.upstream import record_hashes  # noqa: E402

NOTE = (
    "sha256 of every file a gptoss-patch patch band targets, per vLLM release, from the RECORD of the stock "
    "`vllm` wheel on PyPI (null: that release has no such file). Written by scripts/release_hashes.py."
)


def target_files(release: Version) -> list[str]:
    """Every file any patch band targets at `release`, as RECORD names it."""
    return sorted({f"vllm/{band.target}" for spec in all_specs() if (band := spec.band_for(release))})


def stock_wheel(release: Version) -> Path:
    """The release's stock wheel without its compiled extensions (RECORD included): the test cache's slim copy, read
    by HTTP range requests where it is missing (tests/support/ranged.py), else from the whole wheel."""
    try:
        return artefacts.sources(f"vllm=={release}")
    except artefacts.MissingArtefact as exc:
        raise SystemExit(str(exc)) from None


def release_entry(release: Version) -> dict[str, str | None]:
    hashes = record_hashes(stock_wheel(release))
    return {rel: hashes.get(rel) for rel in target_files(release)}


def evidence() -> dict:
    return {
        "format": releases.FORMAT,
        "note": NOTE,
        "releases": {str(release): release_entry(release) for release in KNOWN_RELEASES},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file; write nothing")
    args = parser.parse_args()
    text = json.dumps(evidence(), indent=1, sort_keys=True) + "\n"
    if args.check:
        current = releases.DATA.read_text(encoding="utf-8") if releases.DATA.exists() else ""
        print("up to date" if current == text else f"{releases.DATA} is stale: run scripts/release_hashes.py")
        return 0 if current == text else 1
    releases.DATA.parent.mkdir(exist_ok=True)
    releases.DATA.write_text(text, encoding="utf-8")
    print(f"wrote {releases.DATA.relative_to(ROOT)}: {len(KNOWN_RELEASES)} releases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
