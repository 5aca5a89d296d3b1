"""Version parsing and range checks, always with pre-releases allowed (Fixit #515)."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gptoss_patch.errors import UsageError

# The newest vLLM release whose code every patch was checked against. A newer
# install is "unknown": patches get a verdict from the code's shape alone.
NEWEST_KNOWN = Version("0.33.0")

# Every vLLM release on PyPI from the first one any patch covers to NEWEST_KNOWN (facts, for the
# golden tests and the compatibility matrix).
KNOWN_RELEASES = tuple(
    Version(v)
    for v in (
        "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1",
        "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0",
        "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
    )
)


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"invalid version {text!r}: expected a PEP 440 version such as 0.17.1") from None


def specifier(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text, prereleases=True)
    except InvalidSpecifier:
        raise ValueError(f"invalid version range {text!r}") from None


def in_range(version: Version, versions: str) -> bool:
    return specifier(versions).contains(version, prereleases=True)


def is_unknown_newer(version: Version) -> bool:
    """True for releases past every version the catalogue was checked against."""
    return Version(version.base_version) > NEWEST_KNOWN


def unverified_reason(version: Version, name: str = "vllm") -> str | None:
    """Why `version` is not a release the catalogue was checked against (None when it is one).

    Pre-releases, dev and local builds (`+cu128`, vendor images) may carry code that differs from the
    release; `apply` writes to them only when asked to (--allow-unknown-version), unless engine/releases.py
    proves from file hashes that a build's patch target files are a release's.
    """
    if version in KNOWN_RELEASES and not version.local:
        return None
    if version.local:
        return f"{name} {version} is a local build (+{version.local}), whose code may differ from release {version.public}"
    if version.is_prerelease or version.is_devrelease:
        return f"{name} {version} is a pre-release, not a release gptoss-patch was checked against"
    if is_unknown_newer(version):
        return f"{name} {version} is newer than every release gptoss-patch was checked against"
    return f"{name} {version} is not a release gptoss-patch was checked against"
