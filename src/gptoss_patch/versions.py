"""Version parsing and range checks, always with pre-releases allowed (Fixit #515)."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gptoss_patch.errors import UsageError

# The newest vLLM release whose code every patch was checked against. A newer
# install is "unknown": patches get a verdict from the code's shape alone.
NEWEST_KNOWN = Version("0.33.0")


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
