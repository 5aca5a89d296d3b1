"""Example plugin patch: add a module-level marker to vllm/envs.py, so a process can tell the set is applied.

It shows the whole contract of a patch another package ships: a module whose SPEC is a PatchSpec with
the entry point's name as id, bands naming the target file per vLLM range, a codemod built on
gptoss_patch.patches._base.PatchCodemod (imported lazily: `status` must not import libcst), a
text detector of the patched shape, and a behaviour probe that `verify --behaviour` runs in the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptoss_patch.spec import Band, PackageView, PatchSpec, module_id

if TYPE_CHECKING:
    from gptoss_patch.patches._base import PatchCodemod

MARKER = "GPTOSS_EXAMPLE_PATCHES = True"


def codemod() -> type[PatchCodemod]:
    import libcst as cst

    from gptoss_patch.patches._base import PatchCodemod, code, small_statement

    class EnvsMarker(PatchCodemod):
        ANCHOR = "a top-level `import os`"
        HELPER_SOURCE = f"# added by the gptoss-example-patches plugin\n{MARKER}\n"

        def in_scope(self, statement: cst.BaseStatement) -> bool:
            small = small_statement(statement)
            return isinstance(small, cst.Import) and code(small) == "importos"

        def leave_SimpleStatementLine(self, original: Any, updated: Any) -> Any:
            self.hit()
            return updated

    return EnvsMarker


def is_applied(source: str, _package: PackageView) -> bool:
    return MARKER in source


SPEC = PatchSpec(
    id=module_id(__name__),
    summary="Mark vllm/envs.py as carrying the example patch set (an example of the plugin contract).",
    upstream=(),
    bands=(Band(">=0.15.1", "envs.py"),),
    codemod=codemod,
    is_applied=is_applied,
    probe=str(Path(__file__).with_name("probe_example_envs_marker.py")),  # verify --behaviour runs it in the target
)
