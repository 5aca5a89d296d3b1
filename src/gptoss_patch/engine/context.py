"""One command's view of an installation, shared by every operation of the engine.

`Context` reads each file once (a `--with-diff` overlay replaces the bytes on disk) and parses each
source once, so the dry runs of `status` and the rewrite of `apply` share one libcst tree. libcst is
imported only when a file must be parsed: `status` on a patched installation proves its state from
the ledger's hashes alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from gptoss_patch.engine.ledger import Ledger, Store
from gptoss_patch.errors import PatchFailed
from gptoss_patch.spec import PackageView, PatchSpec
from gptoss_patch.target import Installation
from gptoss_patch.versions import is_unknown_newer

BOM = b"\xef\xbb\xbf"


@dataclass
class Context:
    """One command's view of an installation: the ledger, and file bytes (with --with-diff overlays)."""

    inst: Installation
    store: Store
    ledger: Ledger
    overlay: dict[str, bytes] = field(default_factory=dict)
    _cache: dict[str, bytes | None] = field(default_factory=dict)
    parsed: dict[str, Any] = field(default_factory=dict)  # source text -> (libcst Module, CRLF?)

    def parse(self, text: str) -> tuple[Any, bool]:
        """Each source is parsed once per command: the dry runs and the rewrite share the tree."""
        if text not in self.parsed:
            self.parsed[text] = _parse(text)
        parsed: tuple[Any, bool] = self.parsed[text]
        return parsed

    def dry_run(self, spec: PatchSpec, text: str) -> None:
        """Raise PatchFailed if `spec` cannot rewrite `text` (no code is generated)."""
        _rewrite(spec, self.parse(text)[0], self.package)

    def rewrite(self, specs: list[PatchSpec], text: str) -> str:
        """Apply `specs` in order to one tree and generate the code once."""
        module, crlf = self.parse(text)
        for spec in specs:
            module = _rewrite(spec, module, self.package)
        code: str = module.code
        return code.replace("\n", "\r\n") if crlf else code

    @property
    def package(self) -> PackageView:
        return PackageView(self.inst.package_root)

    def read(self, rel: str) -> bytes | None:
        if rel in self.overlay:
            return self.overlay[rel]
        if rel not in self._cache:
            try:
                self._cache[rel] = (self.inst.site_packages / rel).read_bytes()
            except OSError:
                self._cache[rel] = None
        return self._cache[rel]

    def on_disk(self, rel: str) -> bytes | None:
        saved = self.overlay.pop(rel, None)
        try:
            return self.read(rel)
        finally:
            if saved is not None:
                self.overlay[rel] = saved


def open_context(inst: Installation, overlay: dict[str, bytes] | None = None) -> Context:
    store = Store(inst)
    return Context(inst, store, store.load(), dict(overlay or {}))


def target_of(spec: PatchSpec, version: Version) -> str | None:
    """The file `spec` patches in vLLM `version`, relative to site-packages (a newer unknown release
    is judged by the last band: its shape decides)."""
    band = spec.band_for(version) or (spec.bands[-1] if is_unknown_newer(version) else None)
    return f"vllm/{band.target}" if band else None


def decode(data: bytes) -> str | None:
    try:
        return data.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError:
        return None


def encode(text: str, like: bytes) -> bytes:
    """`text` as bytes, keeping the UTF-8 BOM of the file it came from."""
    return (BOM if like.startswith(BOM) else b"") + text.encode("utf-8")


def _parse(text: str) -> tuple[Any, bool]:
    """Parse with libcst; a file with CRLF line endings throughout is parsed as LF and converted
    back after code generation, so the code we insert (docstrings included) gets CRLF too."""
    import libcst

    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    try:
        return libcst.parse_module(text.replace("\r\n", "\n") if crlf else text), crlf
    except libcst.ParserSyntaxError as exc:
        raise PatchFailed(f"the target file does not parse (line {exc.raw_line}): {exc.message}") from None


def _rewrite(spec: PatchSpec, module: Any, package: PackageView) -> Any:
    """One codemod on a parsed module; drift becomes PatchFailed with a one-line reason."""
    from gptoss_patch.patches._base import Drift

    try:
        return spec.codemod()(package).rewrite(module)
    except Drift as exc:
        raise PatchFailed(f"{spec.id}: drifted: {exc}") from None
