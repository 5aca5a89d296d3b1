"""Run behaviour probes in this (the target) interpreter: `python run.py '{"probes": [...], "verbose": false}'`.

For each probe it prints a `start` line and then a `result` line behind MARKER, so that if the
process dies (a segfault in an extension) behaviour.py knows which probe was running.
A result is {"passed": true|false|null, "evidence", "detail", "missing"}: null = could not run.
"""

import importlib
import importlib.util
import json
import sys

from _builder import NoBuilder
from _common import distribution, emit, exception_line, vllm_version

MISSING = "missing from the target environment: "


def main():
    args = json.loads(sys.argv[1])
    emit({"event": "hello", "python": sys.executable, "vllm": _vllm_version()})
    for probe_id in args["probes"]:
        emit({"event": "start", "id": probe_id})
        result = run_one(probe_id, args.get("verbose", False))
        emit(dict(result, event="result", id=probe_id))


def run_one(probe_id, verbose):
    try:
        module = importlib.import_module("probe_" + probe_id)
    except ImportError:
        return {"passed": None, "evidence": "no behaviour probe for this patch"}
    missing = [distribution(name) for name in module.REQUIRES if importlib.util.find_spec(name) is None]
    if missing:
        return {"passed": None, "missing": missing, "evidence": MISSING + ", ".join(missing)}
    try:
        return module.run(verbose)
    except ModuleNotFoundError as exc:  # a dependency of vLLM itself; one at a time is all Python tells
        name = distribution(exc.name or "?")
        return {"passed": None, "missing": [name], "evidence": f"{MISSING}{name} ({exception_line(exc)})"}
    except NoBuilder as exc:
        return {"passed": None, "evidence": f"cannot run here: {exc}"}
    except Exception as exc:  # a crash inside vLLM is this probe's failure, never a pass
        return {"passed": False, "evidence": "crashed: " + exception_line(exc)}


def _vllm_version():
    try:
        return vllm_version()
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


if __name__ == "__main__":
    main()
