"""Run behaviour probes in this (the target) interpreter: `python run.py '{"probes": [...], "verbose": false}'`.

A plugin patch's probe comes as a file path (`"files": {"<id>": "<path>"}`); a built-in's is probe_<id>.py here.
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
        result = run_one(probe_id, args.get("verbose", False), args.get("files", {}).get(probe_id))
        emit(dict(result, event="result", id=probe_id))


def run_one(probe_id, verbose, path=None):
    if path:
        try:
            module = _load(probe_id, path)
        except OSError as exc:
            return {"passed": None, "evidence": "cannot read its probe " + path + ": " + (exc.strerror or type(exc).__name__)}
        except Exception as exc:  # a plugin's probe that does not even import is its failure, never a pass
            return {"passed": False, "evidence": "its probe " + path + " does not load: " + exception_line(exc)}
    else:
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


def _load(probe_id, path):
    """A plugin's probe script, by path (it may import _common and _builder, which are on sys.path here)."""
    spec = importlib.util.spec_from_file_location("probe_" + probe_id, path)
    if spec is None or spec.loader is None:
        raise OSError(0, "not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vllm_version():
    try:
        return vllm_version()
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


if __name__ == "__main__":
    main()
