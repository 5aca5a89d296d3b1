"""What the installed vLLM accepts, read statically from its files: env-var registry, serve flags, MoE selector.

Importing vllm costs seconds and needs a device platform (known issue G25); `ast` over three or four
files costs milliseconds. The layouts read here are described in docs/vllm-layouts.md ("Files the launcher reads").
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from gptoss_patch import paths
from gptoss_patch.errors import TargetError

ENVS_FILE = "envs.py"
ARG_UTILS_FILE = "engine/arg_utils.py"
# The frontend args dataclass moved twice (docs/vllm-layouts.md#serve-flags); newest layout first.
FRONTEND_FILES = (
    "entrypoints/common/cli_args.py",  # 0.33
    "entrypoints/launchers/cli_args.py",  # 0.29-0.31
    "entrypoints/openai/cli_args.py",  # <= 0.27
)
# Where the MXFP4 MoE backend is chosen: the oracle from 0.19, quantization/mxfp4.py before (docs/vllm-layouts.md#mxfp4-moe-backend-selection).
MXFP4_SELECTOR_FILES = (
    "model_executor/layers/fused_moe/oracle/mxfp4.py",
    "model_executor/layers/quantization/mxfp4.py",
)
KERNEL_CONFIG_FILE = "config/kernel.py"  # the MoEBackend Literal: --moe-backend choices (0.17+)

CACHE_FORMAT = "1"  # bump when the parsers change what they extract
# The files read_capabilities reads (its cache is keyed on their state); READ_FILES, below, adds the uncached readers'.
STATIC_FILES = (ENVS_FILE, ARG_UTILS_FILE, *FRONTEND_FILES, *MXFP4_SELECTOR_FILES, KERNEL_CONFIG_FILE)

# argparse's own and FlexibleArgumentParser's shorthand spellings, which no add_argument call shows.
ALWAYS_ACCEPTED = frozenset({"-h", "--help"})


@dataclass(frozen=True)
class EnvRegistry:
    """The keys of `environment_variables` in envs.py: the only VLLM_* names vLLM reads."""

    names: frozenset[str]
    deprecated: Mapping[str, str] = field(default_factory=dict)  # name -> vLLM's own replacement text

    def knows(self, name: str) -> bool:
        return name in self.names

    def close_matches(self, name: str) -> list[str]:
        return difflib.get_close_matches(name, sorted(self.names), n=1, cutoff=0.8)


@dataclass(frozen=True)
class FlagRegistry:
    """Every `vllm serve` option string the installed version registers, `--no-` forms included."""

    flags: frozenset[str]

    def accepts(self, flag: str) -> bool:
        return canonical_flag(flag) in self.flags

    def close_matches(self, flag: str) -> list[str]:
        return difflib.get_close_matches(canonical_flag(flag), sorted(self.flags), n=1, cutoff=0.75)


@dataclass(frozen=True)
class MoeSelector:
    """What the MXFP4 MoE backend selector of this version listens to."""

    env_reads: frozenset[str]  # VLLM_* read by the selector files (envs.VLLM_X)
    honours_moe_backend: bool  # the selector consults --moe-backend (0.19+; the flag exists from 0.17)
    choices: tuple[str, ...] = ()  # --moe-backend values


@dataclass(frozen=True)
class Capabilities:
    version: Version
    env: EnvRegistry
    flags: FlagRegistry
    moe: MoeSelector

    def has_flag(self, flag: str) -> bool:
        return self.flags.accepts(flag)

    def reads_env(self, name: str) -> bool:
        """Registered, not deprecated; the selector reads it when it is a MoE variable."""
        return self.env.knows(name) and name not in self.env.deprecated

    def to_json(self) -> dict[str, object]:
        """What was read, as plain data: the static cache's entry (and the launcher tests' recorded facts per release)."""
        return {
            "env": sorted(self.env.names),
            "deprecated": dict(sorted(self.env.deprecated.items())),
            "flags": sorted(self.flags.flags),
            "moe_env": sorted(self.moe.env_reads),
            "moe_flag": self.moe.honours_moe_backend,
            "moe_choices": list(self.moe.choices),
        }

    @classmethod
    def from_json(cls, version: Version, raw: Mapping[str, Any]) -> Capabilities:
        """The inverse of to_json; KeyError, TypeError or ValueError for data that is not such an entry."""
        return cls(
            version,
            EnvRegistry(frozenset(raw["env"]), dict(raw["deprecated"])),
            FlagRegistry(frozenset(raw["flags"])),
            MoeSelector(frozenset(raw["moe_env"]), bool(raw["moe_flag"]), tuple(raw["moe_choices"])),
        )


def read_capabilities(package_root: Path, version: Version, cache_dir: Path | None = None) -> Capabilities:
    """Parse the installed files, or reuse the result cached for exactly these files (path, mtime, size).

    Parsing arg_utils.py and envs.py costs ~70 ms of the launcher's 0.3 s budget; a hit costs ~1 ms.
    """
    cache = (cache_dir or default_cache_dir()) / f"{_fingerprint(package_root)}.json"
    cached = _load_cached(cache, version)
    if cached is not None:
        return cached
    caps = Capabilities(version, read_env_registry(package_root), read_flag_registry(package_root), read_moe_selector(package_root))
    _store_cached(cache, caps)
    return caps


def default_cache_dir() -> Path:
    return paths.entry_dir("static")


def _fingerprint(package_root: Path) -> str:
    stats = [str(package_root), CACHE_FORMAT]
    for relpath in STATIC_FILES:
        try:
            info = (package_root / relpath).stat()
            stats.append(f"{relpath}:{info.st_mtime_ns}:{info.st_size}")
        except OSError:
            stats.append(f"{relpath}:-")
    return hashlib.sha256("\n".join(stats).encode()).hexdigest()[:32]


def _load_cached(path: Path, version: Version) -> Capabilities | None:
    raw = paths.read_json(path)
    try:
        return Capabilities.from_json(version, raw)
    except (KeyError, TypeError, ValueError):
        return None  # no entry, or one we cannot trust: parse again


def _store_cached(path: Path, caps: Capabilities) -> None:
    paths.write_json(path, caps.to_json())


# -- envs.py -------------------------------------------------------------------------------------


def read_env_registry(package_root: Path) -> EnvRegistry:
    tree = _parse(package_root, ENVS_FILE)
    registry = _environment_variables_dict(tree)
    if registry is None:
        raise TargetError(f"{package_root / ENVS_FILE} has no `environment_variables` dict; is this a vLLM install?")
    names, deprecated = set(), {}
    for key, value in zip(registry.keys, registry.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
            replacement = _deprecation_text(value)
            if replacement is not None:
                deprecated[key.value] = replacement
    return EnvRegistry(frozenset(names), deprecated)


def _environment_variables_dict(tree: ast.Module) -> ast.Dict | None:
    """The top-level `environment_variables: dict[...] = {...}` (not the TYPE_CHECKING subset)."""
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        value = getattr(node, "value", None)
        named = any(isinstance(t, ast.Name) and t.id == "environment_variables" for t in targets)
        if named and isinstance(value, ast.Dict):
            return value
    return None


def _deprecation_text(value: ast.expr) -> str | None:
    """`deprecated_env(name, "v0.23", "Use --moe-backend ...", getter)` (0.22.1-0.23): the replacement text."""
    if isinstance(value, ast.Call) and _called_name(value) == "deprecated_env" and len(value.args) >= 3:
        text = value.args[2]
        if isinstance(text, ast.Constant) and isinstance(text.value, str):
            return text.value
        return ""
    return None


# -- arg_utils.py and the frontend args ----------------------------------------------------------


def read_flag_registry(package_root: Path) -> FlagRegistry:
    flags = set(ALWAYS_ACCEPTED)
    flags |= _registered_flags(_parse(package_root, ARG_UTILS_FILE), bool_classes=("EngineArgs", "AsyncEngineArgs"))
    frontend = frontend_file(package_root)
    if frontend is not None:
        tree = _parse(package_root, frontend)
        flags |= _registered_flags(tree, bool_classes=())
        flags |= _frontend_dataclass_flags(tree)
    return FlagRegistry(frozenset(flags))


def frontend_file(package_root: Path) -> str | None:
    """The file defining the frontend args dataclass in this version (it moved in 0.29 and 0.33)."""
    for relpath in FRONTEND_FILES:
        path = package_root / relpath
        if path.is_file() and re.search(r"^class \w*FrontendArgs\b", path.read_text(encoding="utf-8", errors="replace"), re.M):
            return relpath
    return None


def _registered_flags(tree: ast.Module, *, bool_classes: tuple[str, ...]) -> set[str]:
    """Option strings of every `*.add_argument("--x", ...)`, plus `--no-x` where argparse makes one."""
    bool_fields = _bool_fields(tree, bool_classes)
    flags: set[str] = set()
    for call in _add_argument_calls(tree):
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
        flags.update(names)
        if _is_boolean_optional(call, bool_fields):
            flags.update(f"--no-{n[2:]}" for n in names if n.startswith("--"))
    return flags


def _add_argument_calls(tree: ast.Module) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            yield node


def _is_boolean_optional(call: ast.Call, bool_fields: set[str]) -> bool:
    """`action=argparse.BooleanOptionalAction`, or `**kwargs["field"]` of a bool field (get_kwargs makes it one)."""
    for kw in call.keywords:
        if kw.arg == "action" and _dotted_tail(kw.value) == "BooleanOptionalAction":
            return True
        if kw.arg is None and any(_subscript_key(node) in bool_fields for node in ast.walk(kw.value)):
            return True  # also `**{**cache_kwargs["enable_prefix_caching"], "default": None}`
    return False


def _subscript_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _bool_fields(tree: ast.Module, class_names: tuple[str, ...]) -> set[str]:
    return {name for cls in _classes(tree, class_names.__contains__) for name, is_bool in _fields(cls) if is_bool}


def _frontend_dataclass_flags(tree: ast.Module) -> set[str]:
    """`--field-name` per field of the *FrontendArgs dataclasses (generated with f"--{key.replace('_','-')}")."""
    flags: set[str] = set()
    for cls in _classes(tree, lambda name: name.endswith("FrontendArgs")):
        for name, is_bool in _fields(cls):
            flag = "--" + name.replace("_", "-")
            flags.add(flag)
            if is_bool:
                flags.add("--no-" + flag[2:])
    return flags


def _classes(tree: ast.Module, wanted: Callable[[str], bool]) -> Iterator[ast.ClassDef]:
    return (node for node in tree.body if isinstance(node, ast.ClassDef) and wanted(node.name))


def _fields(cls: ast.ClassDef) -> Iterator[tuple[str, bool]]:
    """(name, annotated bool) for each annotated class attribute, ClassVars left out."""
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.annotation) if isinstance(n, ast.Attribute)}
            if "ClassVar" not in names:
                yield node.target.id, "bool" in names


# -- defaults a recipe's flags may repeat (bench --compare recipe) ---------------------------------

VLLM_CONFIG_FILE = "config/vllm.py"  # where VllmConfig decides async scheduling when the flag is not given
CACHE_CONFIG_FILE = "config/cache.py"  # CacheConfig: the --gpu-memory-utilization default
# Every file this module reads, the cached and the uncached readers' (tests extract exactly these from the real wheels).
READ_FILES = (*STATIC_FILES, VLLM_CONFIG_FILE, CACHE_CONFIG_FILE)


def read_serve_defaults(package_root: Path) -> dict[str, str]:
    """Flag -> the default this release already gives it, where static reading can tell (not cached: only
    `bench --compare recipe` asks). `--max-num-batched-tokens`: the API server's value in the branch of
    EngineArgs' batch defaults for H100/H200-class GPUs (the one that excludes the A100); `--async-scheduling`:
    on unless something incompatible is set, when config/vllm.py turns an unset flag on."""
    defaults: dict[str, str] = {}
    text = _read(package_root / ARG_UTILS_FILE)
    tokens = _large_gpu_batched_tokens(ast.parse(text)) if text else None
    if tokens is not None:
        defaults["--max-num-batched-tokens"] = f"{tokens} for the API server on GPUs of 70 GiB and more, such as H100 and H200"
    config = _read(package_root / VLLM_CONFIG_FILE) or ""
    if "async_scheduling is None" in config and "async_scheduling = True" in config:
        defaults["--async-scheduling"] = f"on unless an incompatible option is set ({VLLM_CONFIG_FILE})"
    return defaults


def read_default_utilization(package_root: Path) -> float | None:
    """CacheConfig's `gpu_memory_utilization` default (0.92 in vLLM 0.20.2): a plain constant or
    `Field(default=...)`; None where the file or the field is not found (the caller falls back to 0.9)."""
    text = _read(package_root / CACHE_CONFIG_FILE)
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for cls in _classes(tree, lambda name: name == "CacheConfig"):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "gpu_memory_utilization":
                return _number_default(node.value)
    return None


def _number_default(value: ast.expr | None) -> float | None:
    if isinstance(value, ast.Call):
        value = next((k.value for k in value.keywords if k.arg == "default"), value.args[0] if value.args else None)
    if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
        return float(value.value)
    return None


def _large_gpu_batched_tokens(tree: ast.Module) -> int | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "a100" in ast.unparse(node.test):
            for statement in node.body:
                targets = [statement.target] if isinstance(statement, ast.AnnAssign) else getattr(statement, "targets", [])
                value = getattr(statement, "value", None)
                named = any(isinstance(t, ast.Name) and t.id == "default_max_num_batched_tokens" for t in targets)
                if named and isinstance(value, ast.Dict):
                    for key, item in zip(value.keys, value.values):
                        server = key is not None and ast.unparse(key).endswith("OPENAI_API_SERVER")
                        if server and isinstance(item, ast.Constant) and isinstance(item.value, int):
                            return item.value
    return None


# -- MXFP4 MoE selector --------------------------------------------------------------------------


def read_moe_selector(package_root: Path) -> MoeSelector:
    texts = [_read(package_root / relpath) for relpath in MXFP4_SELECTOR_FILES]
    text = "\n".join(t for t in texts if t)
    return MoeSelector(
        env_reads=frozenset(re.findall(r"envs\.(VLLM_\w+)", text)),
        honours_moe_backend="moe_backend" in text,
        choices=read_moe_backend_choices(package_root),
    )


def read_moe_backend_choices(package_root: Path) -> tuple[str, ...]:
    """The values of `MoEBackend = Literal[...]` in config/kernel.py (absent before 0.17)."""
    text = _read(package_root / KERNEL_CONFIG_FILE)
    if not text:
        return ()
    for node in ast.parse(text).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == "MoEBackend" for t in targets):
            value = getattr(node, "value", None)
            if value is None:
                return ()
            return tuple(c.value for c in ast.walk(value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return ()


# -- command-line scanning (FlexibleArgumentParser's spelling rules) -----------------------------


@dataclass(frozen=True)
class FlagUse:
    """One option on a `vllm serve` command line and the arguments that follow it."""

    spelling: str  # as typed: --kv_cache_dtype=fp8
    name: str  # normalised: --kv-cache-dtype
    values: tuple[str, ...]


def scan_flags(args: tuple[str, ...] | list[str]) -> list[FlagUse]:
    uses: list[FlagUse] = []
    for arg in args:
        if _is_option(arg):
            name, _, inline = arg.partition("=")
            uses.append(FlagUse(arg, normalise_flag(name), (inline,) if inline else ()))
        elif uses:
            last = uses[-1]
            uses[-1] = FlagUse(last.spelling, last.name, (*last.values, arg))
    return uses


def last_value(args: Sequence[str], flag: str | tuple[str, ...]) -> str | None:
    """The value argparse would keep for `flag`, or for any of its spellings (`("--tensor-parallel-size", "-tp")`):
    the last occurrence wins. The one reader of a value on vLLM's command line."""
    names = (flag,) if isinstance(flag, str) else flag
    found = [u for u in scan_flags(list(args)) if u.name in names and u.values]
    return found[-1].values[0] if found else None


def normalise_flag(name: str) -> str:
    """`--kv_cache_dtype` -> `--kv-cache-dtype`; `--compilation-config.x_y` -> `--compilation-config.x_y`."""
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def canonical_flag(flag: str) -> str:
    """The registered option a spelling resolves to: dotted sub-keys check their base, -O3 is --optimization-level."""
    name = normalise_flag(flag.partition("=")[0])
    if name.startswith("-O") and not name.startswith("--"):
        return "--optimization-level"
    return name.partition(".")[0]


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", arg)


# -- helpers -------------------------------------------------------------------------------------


def _parse(package_root: Path, relpath: str) -> ast.Module:
    path = package_root / relpath
    text = _read(path)
    if text is None:
        raise TargetError(f"cannot read {path}; is the vLLM installation complete?")
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise TargetError(f"{path} does not parse (line {exc.lineno}): {exc.msg}") from None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _called_name(call: ast.Call) -> str | None:
    return _dotted_tail(call.func)


def _dotted_tail(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None
