"""Scripts that run inside the *target* interpreter, never imported by gptoss-patch itself.

`behaviour.py` starts `python probes/run.py` as a subprocess of the target environment, because only
that environment has vLLM, torch and openai_harmony; gptoss-patch never imports vllm. The scripts
import each other as top-level modules (the script's directory is first on sys.path), import only
the standard library at module level, and must run on every Python that vLLM supports (3.10+).
Results come back as one JSON line on stdout behind `MARKER`, because vLLM logs to stdout too.

A patch's probe is `probe_<id>.py`: its presence is what makes `verify --behaviour` run one.
"""

from pathlib import Path

from gptoss_patch.verify.probes._common import MARKER  # stdlib only, shared with the scripts

__all__ = ["MARKER", "PROBES_DIR", "PROMPTS", "RUNNER", "probe_ids"]

PROBES_DIR = Path(__file__).parent
RUNNER = PROBES_DIR / "run.py"
PROMPTS = PROBES_DIR / "prompts.py"
PROBE_PREFIX = "probe_"


def probe_ids() -> frozenset[str]:
    """The patch ids that have a behaviour probe (a probes/probe_<id>.py)."""
    return frozenset(path.stem.removeprefix(PROBE_PREFIX) for path in PROBES_DIR.glob(f"{PROBE_PREFIX}*.py"))
