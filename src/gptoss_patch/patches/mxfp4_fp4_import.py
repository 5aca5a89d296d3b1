"""Point a fork's `cutlass_fp4_supported` import in mxfp4.py at the module that defines it in the installed vLLM.

Fork patch sets (e.g. the spark-vllm-docker mxfp4 mods) written against another tree import it from
`...quantization.utils.quant_utils`; stock vLLM defines it there only in 0.15.x and in
`...quantization.utils.nvfp4_utils` from 0.16.0, so the server dies at import. Stock mxfp4.py never
imports it at all: on a stock install this patch is `not-needed`.
"""

from typing import TYPE_CHECKING

from gptoss_patch.patches import _shapes
from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

NAME = "cutlass_fp4_supported"
TARGET = "model_executor/layers/quantization/mxfp4.py"
TARGET_PACKAGE = "vllm.model_executor.layers.quantization"
# Where stock vLLM has defined the symbol, newest first (docs/vllm-layouts.md#cutlass_fp4_supported).
DEFINERS = (
    "vllm.model_executor.layers.quantization.utils.nvfp4_utils",
    "vllm.model_executor.layers.quantization.utils.quant_utils",
)


def absolute_module(module: str | None, level: int) -> str:
    """Resolve `from <dots><module> import` as seen from mxfp4.py."""
    if level == 0:
        return module or ""
    base = TARGET_PACKAGE.split(".")[: len(TARGET_PACKAGE.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def module_file(module: str) -> str:
    """`vllm.a.b` -> `a/b.py`, relative to the vllm package."""
    return "/".join(module.split(".")[1:]) + ".py"


def defines(package: PackageView, module: str) -> bool:
    return module.split(".")[0] == "vllm" and package.defines(module_file(module), NAME)


def defining_module(package: PackageView) -> str | None:
    return next((mod for mod in DEFINERS if defines(package, mod)), None)


def codemod() -> "type[PatchCodemod]":
    import libcst as cst

    from gptoss_patch.patches._base import Drift, PatchCodemod, code

    def imports_name(node: cst.ImportFrom) -> bool:
        return not isinstance(node.names, cst.ImportStar) and any(code(a.name) == NAME for a in node.names)

    class Mxfp4Fp4Import(PatchCodemod):
        ANCHOR = f"an import of {NAME} from a module that does not define it"

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            # Top-level imports, including those under `try:` / `if TYPE_CHECKING:`.
            return isinstance(statement, (cst.SimpleStatementLine, cst.Try, cst.If))

        def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
            if not imports_name(updated):
                return updated
            source = absolute_module(code(updated.module) if updated.module else None, len(updated.relative))
            if defines(self.package, source):
                return updated
            definer = defining_module(self.package)
            if definer is None:
                raise Drift(f"no module of the installed vLLM defines {NAME} (looked in {', '.join(DEFINERS)})")
            if isinstance(updated.names, cst.ImportStar) or len(updated.names) != 1:
                raise Drift(f"{NAME} is imported together with other names from {source}; split the import first")
            self.hit()
            return updated.with_changes(module=cst.parse_expression(definer), relative=())

    return Mxfp4Fp4Import


def _import_sources(source: str) -> list[str]:
    return [absolute_module(node.module, node.level) for node in _shapes.imports_of(source, NAME)]


def is_applied(source: str, package: PackageView) -> bool:
    sources = _import_sources(source)
    return bool(sources) and all(defines(package, mod) for mod in sources)


def not_needed(source: str, _package: PackageView) -> str | None:
    if not _import_sources(source):
        return f"mxfp4.py does not import {NAME} (stock vLLM never does; only fork patch sets add it)"
    return None


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Fix a fork's cutlass_fp4_supported import in mxfp4.py to the module that defines it.",
    upstream=("https://github.com/eugr/spark-vllm-docker",),
    bands=(Band(">=0.15.1", TARGET),),
    codemod=codemod,
    is_applied=is_applied,
    not_needed=not_needed,
    reads=tuple(module_file(module) for module in DEFINERS),
    note="Stock vLLM has no such import (not-needed); it matters after applying a fork's mxfp4 diff (--with-diff).",
    stock_not_needed=">=0.15.1",  # every release: only fork patch sets add the import
)
