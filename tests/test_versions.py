"""Version ranges are matched with pre-releases allowed, explicitly (Fixit #515)."""

from __future__ import annotations

import pytest
from packaging.version import Version

from gptoss_patch.errors import UsageError
from gptoss_patch.versions import in_range, is_unknown_newer, parse_version


@pytest.mark.parametrize(
    "version, versions, expected",
    [
        pytest.param("0.17.1", ">=0.15.1,<0.18", True, id="inside"),
        pytest.param("0.18.0", ">=0.15.1,<0.18", False, id="upper-bound-excluded"),
        pytest.param("0.17.2rc1", ">=0.15.1,<0.18", True, id="rc-inside"),
        pytest.param("0.18.0rc1", ">=0.15.1,<0.18", False, id="next-minor-rc-excluded"),
        pytest.param("0.18.0.dev3", ">=0.15.1,<0.18", False, id="next-minor-dev-excluded"),
        pytest.param("0.17.1+cu128", ">=0.15.1,<0.18", True, id="local-label"),
        pytest.param("0.15.1rc1", ">=0.15.1", False, id="rc-before-first-release"),
        pytest.param("0.40.0.dev1", ">=0.15.1", True, id="dev-of-future-release"),
    ],
)
def test_in_range(version, versions, expected):
    assert in_range(Version(version), versions) is expected


@pytest.mark.parametrize(
    "version, expected",
    [("0.33.0", False), ("0.33.0+cu130", False), ("0.33.1", True), ("0.34.0rc1", True), ("0.17.1", False)],
)
def test_unknown_newer(version, expected):
    assert is_unknown_newer(Version(version)) is expected


def test_invalid_version_is_a_usage_error():
    with pytest.raises(UsageError, match="invalid version 'latest'"):
        parse_version("latest")
