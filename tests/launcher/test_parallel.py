"""More than one GPU (issue 26): the parallel sizes after --, nvidia-smi's GPUs and CUDA_VISIBLE_DEVICES, the model's
shape, the per-GPU memory estimate, the profile settings that depend on them, and the pre-flight rows G33-G38 and G42.

Every GPU here is a fake `nvidia-smi` on PATH and every checkpoint a fake config.json: no wheel, no GPU."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version

from gptoss_patch.errors import TargetError, UsageError
from gptoss_patch.launcher import memory, parallel, plan as planning, preflight, profiles, static
from gptoss_patch.launcher.gpus import Gpu
from gptoss_patch.launcher.results import LaunchPlan, Status
from gptoss_patch.model.recipe import GPT_OSS_20B, GPT_OSS_120B
from tests.launcher.recorded import facts
from tests.support.cli import run
from tests.support.fakes import install_fake_nvidia_smi

H100 = "NVIDIA H100 80GB HBM3, 9.0, 81559"
H200 = "NVIDIA H200, 9.0, 143771"
L40S = "NVIDIA L40S, 8.9, 46068"


def smi(*models: str) -> str:
    """nvidia-smi's csv for GPUs 0..n-1 of the given models (index, uuid, name, compute_cap, memory.total)."""
    return "".join(f"{i}, GPU-{i:04d}aaaa-bbbb, {model}\n" for i, model in enumerate(models))


@pytest.fixture
def gpus(tmp_path: Path):
    """Install a fake nvidia-smi listing `models`; returns the environment a plan would see."""

    def install(*models: str, **env: str) -> dict[str, str]:
        install_fake_nvidia_smi(tmp_path / "smi-bin", smi(*models))
        return {"PATH": f"{tmp_path / 'smi-bin'}:/usr/bin:/bin", **env}

    return install


def caps(*flags: str, version: str = "0.33.0") -> static.Capabilities:
    return static.Capabilities(
        Version(version),
        static.EnvRegistry(frozenset()),
        static.FlagRegistry(frozenset(flags)),
        static.MoeSelector(frozenset(), False),
    )


ALL_FLAGS = caps(
    "--cudagraph-capture-sizes", "--max-num-seqs", "--gpu-memory-utilization", "--max-num-batched-tokens", "--max-model-len",
)  # fmt: skip


def options(model: str | None = "openai/gpt-oss-120b", *extra: str, concurrency: str | None = None, gpu: str = "sm90"):
    return planning.launch_options(model, gpu=gpu, concurrency=concurrency, extra_args=tuple(extra))


def plan_for(opts: planning.LaunchOptions, environ: dict[str, str], flags: static.Capabilities = ALL_FLAGS,
             default_utilization: float | None = None) -> LaunchPlan:
    """A plan with only what the multi-GPU checks read: argv (the profile's parallel settings, then yours), options."""
    context = planning.parallel_context(opts, environ, default_utilization)
    wanted, parallel_notes = planning._parallel_settings(context, opts, flags)
    settings, dropped = planning._apply_overrides(wanted, opts.extra_args, environ)  # yours win, as in resolve()
    notes = [*parallel_notes, *dropped]
    return LaunchPlan(
        installation=None, executable=Path("/venv/bin/vllm"), model=opts.model or "", profile=opts.gpu.profile,
        profile_source="--gpu", settings=tuple(settings), notes=tuple(notes), extra_args=opts.extra_args, base_env=environ,
        options=opts, capabilities=flags, parallel=context, patch_report=None, vocabulary=None,
    )  # fmt: skip


def rows(plan: LaunchPlan, issue: str) -> list:
    return [c for c in preflight.check_parallel(plan) if c.issue == issue]


# -- the sizes ------------------------------------------------------------------------------------


def test_vllms_own_spellings_are_read_and_the_last_one_wins():
    layout = parallel.layout_of(["-tp", "4", "--tensor-parallel-size=2", "--data-parallel-size", "2", "-pp", "1"])
    assert (layout.tp, layout.dp, layout.pp, layout.total_gpus, layout.local_gpus) == (2, 2, 1, 4, 4)
    assert parallel.layout_of([]) == parallel.Layout()


def test_a_size_that_is_not_a_number_is_one_usage_error():
    with pytest.raises(UsageError, match=r"^--tensor-parallel-size two: expected a whole number of 1 or more$"):
        parallel.layout_of(["-tp", "two"])


def test_multi_node_layouts_count_this_hosts_share():
    assert parallel.layout_of(["-dp", "4", "-dpl", "2", "-tp", "2"]).local_gpus == 4
    ray = parallel.layout_of(["-tp", "8", "--distributed-executor-backend", "ray"])
    assert ray.multi_node and ray.local_gpus == 1


# -- the GPUs (read by launcher/gpus.py: tests/launcher/test_gpus.py) ------------------------------


def test_unreadable_nvidia_smi_output_is_a_warning_not_a_crash(tmp_path):
    install_fake_nvidia_smi(tmp_path / "bin", "9.0\n")
    environ = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    plan = plan_for(options(), environ)
    [row] = [c for c in preflight.check_parallel(plan) if c.name == "gpus"]
    assert row.status is Status.WARN and "unexpected nvidia-smi line" in row.message


# -- the model ------------------------------------------------------------------------------------


def test_model_ids_get_the_published_shapes():
    big, small = parallel.model_shape("openai/gpt-oss-120b"), parallel.model_shape("openai/gpt-oss-20b")
    assert big is not None and small is not None
    assert (big.layers, big.experts, big.q_heads, big.kv_heads, big.head_dim) == (36, 128, 64, 8, 64)
    assert (small.layers, small.experts) == (24, 32)
    assert round(big.weights_bytes / memory.GIB) == 61 and round(small.weights_bytes / memory.GIB) == 13
    assert parallel.model_shape("meta-llama/Llama-3-8B") is None


def write_config(directory: Path, **changes: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**GPT_OSS_120B.hf_config(), **changes}))
    return directory


def test_a_local_checkpoint_is_read_from_its_config_json(tmp_path):
    directory = write_config(tmp_path / "odd", num_attention_heads=48, num_key_value_heads=6, num_local_experts=96)
    shape = parallel.model_shape(str(directory))
    assert shape is not None and (shape.q_heads, shape.kv_heads, shape.experts, shape.source) == (48, 6, 96, "its config.json")
    assert shape.weights_bytes > 0  # no safetensors (--load-format dummy): counted from the config


def test_safetensors_on_disk_are_the_weights(tmp_path):
    directory = write_config(tmp_path / "m")
    (directory / "model-00001.safetensors").write_bytes(b"\0" * 4096)
    shape = parallel.model_shape(str(directory))
    assert shape is not None and shape.weights_bytes == 4096


@pytest.mark.parametrize(("tp", "problems"), [(1, []), (2, []), (4, []), (8, []), (16, []), (3, ["64 query heads", "8 KV heads", "128 experts"])])
def test_divisibility_of_heads_and_experts(tp, problems):
    shape = parallel.model_shape("openai/gpt-oss-120b")
    assert shape is not None and parallel.divisibility_problems(shape, parallel.Layout(tp=tp)) == problems


# -- bad input: exit 4, one line with the fix ---------------------------------------------------------


def one_line_exit_4(plan: LaunchPlan, issue: str) -> str:
    with pytest.raises(TargetError) as caught:
        preflight.require_parallel(plan)
    message = str(caught.value)
    assert caught.value.exit_code == 4 and "\n" not in message and f"({issue}); " in message
    return message


def test_tp_larger_than_the_visible_gpus(gpus):
    message = one_line_exit_4(plan_for(options("openai/gpt-oss-120b", "-tp", "4"), gpus(H200, H200)), "G33")
    assert message == "TP 4 x DP 1 needs 4 GPUs on this host; nvidia-smi shows 2 (G33); --tensor-parallel-size 2, or make 4 GPUs visible"


def test_tp_times_dp_counts_against_cuda_visible_devices(gpus):
    environ = gpus(H200, H200, H200, H200, CUDA_VISIBLE_DEVICES="0,1")
    message = one_line_exit_4(plan_for(options("openai/gpt-oss-120b", "-tp", "2", "-dp", "2"), environ), "G33")
    assert "needs 4 GPUs" in message and "CUDA_VISIBLE_DEVICES=0,1 shows 2" in message and "--data-parallel-size 1" in message


def test_tp_not_dividing_the_heads_or_experts(gpus):
    message = one_line_exit_4(plan_for(options("openai/gpt-oss-120b", "-tp", "3"), gpus(H200, H200, H200)), "G36")
    assert "does not divide 64 query heads or 8 KV heads or 128 experts" in message
    assert message.endswith("--tensor-parallel-size one of 1, 2, 4, 8")


def test_tp_not_dividing_a_local_checkpoints_heads(tmp_path, gpus):
    directory = write_config(tmp_path / "m", num_attention_heads=48, num_key_value_heads=6)
    message = one_line_exit_4(plan_for(options(str(directory), "-tp", "4"), gpus(H200, H200, H200, H200)), "G36")
    assert "48 query heads" not in message and "6 KV heads" in message and "its config.json" in message


def test_mixed_gpu_models(gpus):
    message = one_line_exit_4(plan_for(options("openai/gpt-oss-20b", "-tp", "2"), gpus(H100, L40S, H100)), "G35")
    assert "different models" in message and "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,2" in message


def test_a_gpu_listed_twice(gpus):
    message = one_line_exit_4(plan_for(options("openai/gpt-oss-20b", "-tp", "2"), gpus(H100, H100, CUDA_VISIBLE_DEVICES="0,0")), "G34")
    assert "Duplicate GPU detected" in message and "CUDA_VISIBLE_DEVICES=0" in message


def test_the_cli_exits_4_with_one_line_before_anything_starts(gpus, monkeypatch, tmp_path):
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\necho started > " + str(tmp_path / "started") + "\n")
    exe.chmod(0o755)
    environ = gpus(H200, H200)
    monkeypatch.setenv("PATH", environ["PATH"])
    plan = plan_for(options("openai/gpt-oss-120b", "-tp", "4", "--port", "0"), environ)
    plan = LaunchPlan(**{**plan.__dict__, "executable": exe, "installation": SimpleNamespace(reinstall_command="pip install vllm")})
    monkeypatch.setattr("gptoss_patch.launcher.prepare._plan", lambda *_args: plan)  # the target lookup: nothing to find here
    result = run("serve", "openai/gpt-oss-120b", "--", "-tp", "4")
    assert result.exit_code == 4, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: TP 4 x DP 1 needs 4 GPUs") and "--tensor-parallel-size 2" in lines[0]
    assert not (tmp_path / "started").exists()


def test_a_host_whose_gpus_fit_passes_with_one_row(gpus):
    checks = preflight.check_parallel(plan_for(options("openai/gpt-oss-120b", "-tp", "2"), gpus(H200, H200, H200)))
    gpu_rows = [c for c in checks if c.name == "gpus"]
    assert [c.status for c in gpu_rows] == [Status.PASS]
    assert gpu_rows[0].message == "TP 2 x DP 1: 2 of 3 visible GPU(s) used, 2 x NVIDIA H200 (9.0)"


def test_mixed_hosts_with_index_lists_warn_about_cuda_device_order(gpus):
    environ = gpus(H100, L40S, H100, CUDA_VISIBLE_DEVICES="0,2")
    [row] = rows(plan_for(options("openai/gpt-oss-20b", "-tp", "2"), environ), "G35")
    assert row.status is Status.WARN and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in row.fix
    environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    assert rows(plan_for(options("openai/gpt-oss-20b", "-tp", "2"), environ), "G35") == []


def test_without_nvidia_smi_a_multi_gpu_layout_is_a_warning():
    plan = plan_for(options("openai/gpt-oss-120b", "-tp", "2"), {"PATH": "/nonexistent"})
    [row] = preflight.check_parallel(plan)
    assert row.status is Status.WARN and "none of them is checked" in row.message


# -- memory (G37, G38) -------------------------------------------------------------------------------


def test_the_recipes_h100_out_of_memory_case_fails_and_its_fix_passes(gpus):
    environ = gpus(H100)
    trap = plan_for(options("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "8192"), environ)
    [row] = rows(trap, "G37")
    assert row.status is Status.FAIL and "run out of memory" in row.message
    assert row.fix.startswith("--gpu-memory-utilization 0.95 --max-num-batched-tokens 1024")
    fixed = plan_for(options("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.95", "--max-num-batched-tokens", "1024"), environ)
    assert [c.status for c in rows(fixed, "G37")] == [Status.PASS]


def test_the_profile_applies_the_recipes_fix_on_one_h100(gpus):
    plan = plan_for(options("openai/gpt-oss-120b"), gpus(H100))
    flags, env = plan.settings[:2], plan.settings[2:]
    assert [s.argv for s in flags] == [("--gpu-memory-utilization", "0.95"), ("--max-num-batched-tokens", "1024")]
    assert all("recipe guide" in s.why and "G37" in s.why for s in plan.settings)
    # Measured on vLLM 0.20.2: without expandable segments the 120b runs out of memory while loading, recipe or not.
    assert [(s.kind, s.name, s.values) for s in env] == [("env", "PYTORCH_CUDA_ALLOC_CONF", ("expandable_segments:True",))]
    assert [c.status for c in rows(plan, "G37")] == [Status.PASS]


@pytest.mark.parametrize(("environ_extra", "extra", "warned"), [
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, (), True),  # yours wins, without segments
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:True"}, (), False),
    ({}, ("--enable-sleep-mode",), True),  # its allocator refuses expandable segments: a note, and the warning
])  # fmt: skip
def test_loading_the_120b_on_one_h100_without_expandable_segments_warns(gpus, environ_extra, extra, warned):
    plan = plan_for(options("openai/gpt-oss-120b", *extra), {**gpus(H100), **environ_extra})
    assert "PYTORCH_CUDA_ALLOC_CONF" not in [s.name for s in plan.settings]
    load = [c for c in rows(plan, "G37") if "while loading" in c.message]
    assert [c.status for c in load] == ([Status.WARN] if warned else [])
    if warned:
        assert load[0].fix.startswith("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if extra:
        assert any("sleep mode" in n for n in plan.notes)


@pytest.mark.parametrize("environ_models", [(H200,), (H100, H100)])
def test_no_recipe_memory_settings_on_h200_or_at_tp2(gpus, environ_models):
    extra = ("-tp", "2") if len(environ_models) == 2 else ()
    plan = plan_for(options("openai/gpt-oss-120b", *extra), gpus(*environ_models))
    assert plan.settings == ()
    assert [c.status for c in rows(plan, "G37")] == [Status.PASS]


@pytest.mark.parametrize(("installed", "budget"), [(None, "0.9 x"), ("0.20.2", "0.92 x")])
def test_the_budget_uses_the_installed_releases_utilization_default(gpus, installed, budget):
    # vLLM 0.20.2's CacheConfig says 0.92 (its recorded facts: tests/launcher/facts/); a release whose default cannot be
    # read is taken at 0.9.
    default = facts(installed).default_utilization if installed else None
    [row] = rows(plan_for(options("openai/gpt-oss-120b"), gpus(H200), default_utilization=default), "G37")
    assert row.status is Status.PASS and budget in row.message


def test_the_20b_on_one_h100_needs_no_recipe_settings(gpus):
    assert plan_for(options("openai/gpt-oss-20b"), gpus(H100)).settings == ()


def test_tp2_on_h100_above_095_fails_and_095_passes(gpus):
    environ = gpus(H100, H100)
    [row] = rows(plan_for(options("openai/gpt-oss-120b", "-tp", "2", "--gpu-memory-utilization", "0.96"), environ), "G38")
    assert row.status is Status.FAIL and row.fix == "--gpu-memory-utilization 0.95 or less"
    assert rows(plan_for(options("openai/gpt-oss-120b", "-tp", "2", "--gpu-memory-utilization", "0.95"), environ), "G38") == []
    note = plan_for(options("openai/gpt-oss-120b", "-tp", "2"), environ).notes
    assert any("above 0.95" in n and "G38" in n for n in note)


# -- the sampler warm-up (G42) ----------------------------------------------------------------------
# Measured on one H200 with vLLM 0.20.2: gpt-oss-120b at 0.92 and vLLM's --max-num-seqs 1024 stops with "CUDA out of
# memory occurred when warming up sampler with 1024 dummy requests"; --max-num-seqs 64 starts and serves.

H200_MEASURED = ("--max-model-len", "8192", "--gpu-memory-utilization", "0.92")


def test_the_measured_h200_sampler_warm_up_warns_at_1024_sequences(gpus):
    [row] = rows(plan_for(options("openai/gpt-oss-120b", *H200_MEASURED), gpus(H200)), "G42")
    assert row.status is Status.WARN
    assert "--max-num-seqs 1024 needs about 9.2 GiB" in row.message and "201088 vocabulary" in row.message
    assert "0.92 x 140.4 GiB leaves 11.2 GiB, about 8.6 GiB after" in row.message
    assert row.fix == "-- --max-num-seqs 512 or --gpu-memory-utilization 0.91"


@pytest.mark.parametrize("layout", [("-tp", "2"), ("-dp", "2"), ("-dp", "2", "-ep")])
def test_no_sampler_warning_on_two_gpus_where_none_ran_out(gpus, layout):
    # Measured (vLLM 0.20.2, 120b, two H200s, 0.92, 1024 sequences): TP=2 and DP=2 all started (141.5 of 143.8 GiB
    # used), where the warning had been given for each.
    plan = plan_for(options("openai/gpt-oss-120b", *H200_MEASURED, *layout), gpus(H200, H200))
    assert rows(plan, "G42") == []
    over = plan_for(options("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.99", *layout), gpus(H200, H200))
    assert [c.status for c in rows(over, "G42")] == [Status.FAIL]  # not even the logits and one copy: still a failure


def test_the_measured_h200_start_with_64_sequences_passes(gpus):
    assert rows(plan_for(options("openai/gpt-oss-120b", *H200_MEASURED, "--max-num-seqs", "64"), gpus(H200)), "G42") == []


def test_the_suggested_fixes_clear_the_warning(gpus):
    environ = gpus(H200)
    for fix in (("--max-num-seqs", "512"), ("--gpu-memory-utilization", "0.91")):
        assert rows(plan_for(options("openai/gpt-oss-120b", *H200_MEASURED, *fix), environ), "G42") == []


def test_a_sampler_warm_up_clearly_over_fails_with_only_the_utilization_fix(gpus):
    [row] = rows(plan_for(options("openai/gpt-oss-120b", "--gpu-memory-utilization", "0.99"), gpus(H200)), "G42")
    assert row.status is Status.FAIL and row.fix == "--gpu-memory-utilization 0.91"


@pytest.mark.parametrize(("model", "environ_extra", "extra"), [
    # started on an H100 (vLLM 0.20.2) with less room outside the budget than the 12-copy estimate asks for:
    ("openai/gpt-oss-20b", {}, ("--max-model-len", "4096", "--gpu-memory-utilization", "0.92")),
    ("openai/gpt-oss-120b", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, ("--gpu-memory-utilization", "0.92")),
])  # fmt: skip
def test_no_sampler_warning_where_a_start_was_measured_to_warm_up(gpus, model, environ_extra, extra):
    assert rows(plan_for(options(model, *extra), {**gpus(H100), **environ_extra}), "G42") == []


def test_the_profile_on_one_h100_leaves_the_120b_no_sampler_warning(gpus):
    # 0.95 with 1024 sequences started with the profile's expandable segments (measured on vLLM 0.20.2)
    assert rows(plan_for(options("openai/gpt-oss-120b"), gpus(H100)), "G42") == []


def test_the_sampler_headroom_counts_the_vocabulary_of_the_checkpoint():
    gpu = Gpu(0, "GPU-0", "NVIDIA H200", "9.0", 143771)
    shape = parallel.model_shape("openai/gpt-oss-120b")
    room = memory.sampler_headroom(shape, parallel.Layout(), gpu, ["--gpu-memory-utilization", "0.92"])
    assert room.max_num_seqs == 1024  # vLLM's default on a GPU of 70 GiB and more
    assert room.need() == 1024 * 201088 * 4 * 12 and room.need(2) == 1024 * 201088 * 4 * 2
    assert room.short and not room.clearly_over


@pytest.mark.parametrize(
    ("args", "grown"),
    [
        ((), False),
        (("--max-cudagraph-capture-size", "1024"), False),
        (("--max-cudagraph-capture-size", "2048"), True),  # the sm90 profile's
        (("--cudagraph-capture-sizes", "1", "16", "2048"), True),  # --concurrency's list to the profile's maximum
        (("--cudagraph-capture-sizes", "1", "16", "64"), False),
    ],
)
def test_the_graph_pool_outside_the_budget_grows_with_captures_beyond_1024(args, grown):
    # Measured on the 20b (H100, vLLM 0.20.2): 1.21 GiB of graphs up to 1024, 1.58 up to 2048.
    gpu = Gpu(0, "GPU-0", "NVIDIA H200", "9.0", 143771)
    room = memory.sampler_headroom(parallel.model_shape("openai/gpt-oss-120b"), parallel.Layout(), gpu, list(args))
    base = int(memory.CUDA_GRAPH_POOL_GIB * memory.GIB)
    assert (room.graph_pool > base) is grown and room.graph_pool <= base * 1.31 + 1


def test_no_sampler_check_without_the_gpus_memory(gpus):
    plan = plan_for(options("openai/gpt-oss-120b", *H200_MEASURED), gpus("NVIDIA GB10, 12.1, [N/A]"))
    assert rows(plan, "G42") == []
    [row] = rows(plan, "G37")
    assert "sampler warm-up check (G42) are not run" in row.message


def test_kv_cache_per_sequence_counts_the_window_with_a_prefill_chunk_and_splits_over_tp():
    shape = parallel.model_shape("openai/gpt-oss-120b")
    assert shape is not None
    one = memory.kv_bytes_per_sequence(shape, parallel.Layout(), 131072, 2, batched_tokens=8192)
    # 18 full layers hold every token; 18 sliding ones the window - 1 plus a prefill chunk, in 16-token blocks, + 1 block
    assert one == 2 * 8 * 64 * 2 * (18 * 131072 + 18 * (521 * 16))
    assert memory.kv_bytes_per_sequence(shape, parallel.Layout(tp=2), 131072, 2, batched_tokens=8192) == one // 2
    assert memory.kv_bytes_per_sequence(shape, parallel.Layout(tp=16), 131072, 2, batched_tokens=8192) == one // 8


def test_the_requests_that_fit_match_vllms_maximum_concurrency_on_two_h200s(gpus):
    # Measured (vLLM 0.20.2, 120b, --load-format dummy --max-model-len 8192, two H200s, TP=2, 0.92): vLLM logged
    # "Maximum concurrency for 8,192 tokens per request: 319"; the window-only count said 628.
    plan = plan_for(options("openai/gpt-oss-120b", "-tp", "2", "--max-model-len", "8192"), gpus(H200, H200), default_utilization=0.92)
    [row] = [c for c in rows(plan, "G37") if "fit at once" in c.message]
    fits = int(row.message.split("; ")[-1].split(" ")[0])
    assert abs(fits - 319) / 319 < 0.03, row.message


@pytest.mark.parametrize("ep", [(), ("-ep",)])
def test_data_parallel_splits_the_experts_over_the_ranks(gpus, ep):
    # Measured (vLLM 0.20.2, 120b, -dp 2 without -ep, two H200s): "Falling back to AllGather+ReduceScatter
    # dispatch/combine", 35.7 GiB loaded per rank (65.6 GiB at TP=1): not two whole copies.
    shape = parallel.model_shape("openai/gpt-oss-120b")
    assert shape is not None
    one = memory.weights_per_gpu(shape, parallel.Layout())
    two = memory.weights_per_gpu(shape, parallel.layout_of(["-dp", "2", *ep]))
    assert round(one / memory.GIB, 1) == 60.8 and round(two / memory.GIB, 1) == 32.4
    assert 35.7 / 65.6 - 0.05 < two / one < 35.7 / 65.6 + 0.05
    [row] = [c for c in rows(plan_for(options("openai/gpt-oss-120b", "-dp", "2", *ep), gpus(H200, H200)), "G37") if "fit" in c.message]
    assert "weights 32.4 GiB (the experts split over 2 ranks: TP x DP)" in row.message


@pytest.mark.parametrize(("text", "tokens"), [("8192", 8192), ("32k", 32000), ("32K", 32768), ("1M", 1024**2), ("-1", None), (None, None)])
def test_human_readable_token_counts(text, tokens):
    assert memory.parse_tokens(text) == tokens


# -- the profile per data-parallel rank -----------------------------------------------------------


def test_capture_sizes_are_per_data_parallel_rank():
    [setting] = planning._capture_sizes((5, 10, 64), ALL_FLAGS, ("-dp", "2"), 2)
    sizes = [int(v) for v in setting.values]
    assert 3 in sizes and 5 in sizes and 32 in sizes and 10 not in sizes  # 5 -> 3, 10 -> 5, 64 -> 32
    assert setting.why.startswith("--data-parallel-size 2: each rank sees concurrency / 2, rounded up (5 -> 3, 10 -> 5, 64 -> 32)")
    assert planning._capture_sizes((5, 10), ALL_FLAGS, (), 1) == [profiles.capture_sizes_setting((5, 10), ALL_FLAGS)]


def test_max_num_seqs_covers_the_largest_concurrency_per_rank(gpus):
    plan = plan_for(options("openai/gpt-oss-20b", "-dp", "2", concurrency="1,600"), gpus(L40S, L40S))
    [setting] = [s for s in plan.settings if s.name == "--max-num-seqs"]
    assert setting.values == ("300",) and "per DP rank (600 over 2 ranks)" in setting.why
    # An H200's default (1024) already covers it; so does the default for 256 per rank
    assert plan_for(options("openai/gpt-oss-20b", concurrency="1,600"), gpus(H200)).settings == ()
    assert plan_for(options("openai/gpt-oss-20b", "-dp", "4", concurrency="1,600"), gpus(*[L40S] * 4)).settings == ()


def test_a_max_num_seqs_below_the_concurrency_per_rank_warns(gpus):
    plan = plan_for(options("openai/gpt-oss-20b", "--max-num-seqs", "8", concurrency="1,64"), gpus(H200))
    [row] = [c for c in preflight.check_parallel(plan) if c.name == "flags"]
    assert row.status is Status.WARN and row.fix == "--max-num-seqs 64, or drop it"


def test_a_flag_the_release_lacks_becomes_a_note(gpus):
    plan = plan_for(options("openai/gpt-oss-120b"), gpus(H100), caps("--gpu-memory-utilization"))
    assert [s.name for s in plan.settings] == ["--gpu-memory-utilization", "PYTORCH_CUDA_ALLOC_CONF"]
    assert any(n.startswith("--max-num-batched-tokens 1024 not set: vLLM 0.33.0 has no such flag") for n in plan.notes)


def test_the_20b_recipe_shape_matches_the_published_one():
    shape = parallel.model_shape("openai/gpt-oss-20b")
    assert shape is not None and shape.weights_bytes == parallel._recipe_bytes(GPT_OSS_20B)


def test_requests_at_the_full_context_warn_only_for_an_explicit_max_model_len(gpus):
    environ = gpus(H200)
    assert [c.status for c in rows(plan_for(options("openai/gpt-oss-120b", concurrency="1,64"), environ), "G37")] == [Status.PASS]
    plan = plan_for(options("openai/gpt-oss-120b", "--max-model-len", "131072", concurrency="1,64"), environ)
    assert [c.status for c in rows(plan, "G37")] == [Status.PASS, Status.WARN]
