"""The transactional core: status / apply / diff / verify / revert. It returns Reports; it never prints or exits.

Every write goes through one transaction (transaction.py): originals and new bytes are stored and
the journal and ledger are made durable before any target file is replaced, so an interruption at
any point is finished by the next command of any kind (`recover`).

    context.py      one command's view of an installation (file bytes, parsed trees, the ledger)
    status.py       the state of each patch: ledger hashes first, the code's shape second
    apply.py        plan every file in memory, then commit them together (diff.py: the dry run's diffs)
    revert.py       back to the original bytes, replaying the patches that stay
    verify.py       compile the patched files in the target interpreter, re-check each shape
    transaction.py  the journalled commit and the recovery of an interrupted one
    ledger.py       the ledger, journal and lock inside vLLM's .dist-info
    record.py       vLLM's RECORD: pristine hashes, and our ledger files registered in it
    releases.py     which checked release a non-stock build is, from its RECORD hashes
    withdiff.py     `apply --with-diff`: a user's diff, applied in memory first
    faults.py       named crash points, for the fault-injection tests

Callers use the operations re-exported here: `from gptoss_patch import engine; engine.apply(inst)`.
"""

from gptoss_patch.engine.apply import apply
from gptoss_patch.engine.context import target_of
from gptoss_patch.engine.revert import orphaned_patches, recorded_user_patches, revert
from gptoss_patch.engine.status import status
from gptoss_patch.engine.transaction import recover
from gptoss_patch.engine.verify import verify

__all__ = ["apply", "orphaned_patches", "recorded_user_patches", "recover", "revert", "status", "target_of", "verify"]
