"""gptoss_patch.numerics without vLLM: the layer shape, the kernel report read back, the server comparisons, the
tables at 80 columns; and launcher/reproducibility.py (the reproducibility row wherever Marlin runs) on plain plans."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from gptoss_patch import model as models
from gptoss_patch.bench.spec import BenchFailed, ServerSpec
from gptoss_patch.errors import TargetError, UsageError
from gptoss_patch.launcher import reproducibility
from gptoss_patch.launcher.results import LaunchPlan, Setting, Status
from gptoss_patch.numerics import kernels, served

SPEC = ServerSpec("profile", ("vllm", "serve", "/m"), {}, 8000, "/m")


def write_config(directory: Path, recipe: models.Recipe) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(recipe.hf_config()))
    return directory


def test_the_shape_comes_from_config_json_and_says_whether_experts_are_mxfp4(tmp_path: Path) -> None:
    mxfp4 = kernels.layer_shape(str(write_config(tmp_path / "m20b", models.GPT_OSS_20B)), None)
    assert mxfp4.experts == "mxfp4" and mxfp4.shape["hidden_size"] == 2880 and mxfp4.shape["experts_per_token"] == 4
    assert mxfp4.shape["num_local_experts"] == 32 and mxfp4.source.endswith("config.json")
    tiny = kernels.layer_shape(str(write_config(tmp_path / "tiny", models.TINY)), None)
    assert tiny.experts == "bf16"
    assert kernels.skipped_for(tiny, ())[0].startswith("MXFP4 MoE kernels (marlin, triton, flashinfer): tiny's experts are bf16")
    assert kernels.skipped_for(mxfp4, ()) == [] and kernels.skipped_for(tiny, ("cpu",)) == []


def test_the_shape_from_shape_or_a_released_id_and_refusals(tmp_path: Path) -> None:
    assert kernels.layer_shape("anything", "120b").shape["num_local_experts"] == 128
    assert kernels.layer_shape("openai/gpt-oss-20b", None).experts == "mxfp4"
    with pytest.raises(UsageError, match="cannot tell the shape of 'some/model'"):
        kernels.layer_shape("some/model", None)
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UsageError, match="is not a gpt-oss checkpoint"):
        kernels.layer_shape(str(other), None)


def test_token_counts_and_backends_are_checked() -> None:
    assert kernels.parse_tokens("1,8,64,512,8") == (1, 8, 64, 512)
    for bad in ("", "0", "a,b"):
        with pytest.raises(UsageError, match="--tokens"):
            kernels.parse_tokens(bad)
    assert kernels.parse_backends("marlin, triton") == ("marlin", "triton") and kernels.parse_backends(None) == ()
    with pytest.raises(UsageError, match="--backend cutlass: expected some of cpu, marlin, triton, flashinfer"):
        kernels.parse_backends("marlin,cutlass")


FAKE_CHECK = """
import json, sys
payload = json.loads(sys.stdin.readline())
print("INFO vLLM logs to stdout too")
print(json.dumps({"device": "cpu", "vllm": "0.17.1", "torch": "2.x", "echo": payload,
                  "results": [{"layer": "moe", "backend": "cpu", "tokens": 8, "rel_error": 0.004, "max_abs_error": 0.01,
                               "runs": 3, "max_run_diff": 0.0, "batch_diff": 0.0}],
                  "not_run": [{"layer": "moe", "backend": "marlin", "reason": "no CUDA GPU"}], "skipped": []}))
"""


def kernel_check_script(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`source` in place of kernel_check.py, for the processes kernels.run starts."""
    script = tmp_path / "check.py"
    script.write_text(source)
    monkeypatch.setattr(kernels, "SCRIPT", script)
    return script


def test_the_kernel_check_runs_in_the_target_and_its_last_json_line_is_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = kernel_check_script(FAKE_CHECK, tmp_path, monkeypatch)
    shape = kernels.layer_shape("x", "tiny")
    report = kernels.run(sys.executable, shape, tokens=(1, 8), repeat=2, backends=("cpu", "marlin"))
    assert report.results[0]["backend"] == "cpu" and report.not_run[0]["reason"] == "no CUDA GPU"
    assert report.skipped[0].startswith("MXFP4 MoE kernels (marlin)")  # named, bf16 experts: said, not run
    document = report.to_json()
    assert document["shape"]["hidden_size"] == 256 and document["reference"] == "float64"
    script.write_text("import sys; sys.stderr.write('Traceback...\\nImportError: no torch\\n'); sys.exit(1)")
    with pytest.raises(TargetError, match=r"the kernel check failed in .* \(exit 1\): ImportError: no torch"):
        kernels.run(sys.executable, shape)


def test_each_gpu_moe_backend_gets_a_process_of_its_own_unless_sequential() -> None:
    every = kernels.BACKENDS

    def shares(plan: list[kernels.CheckProcess]) -> list[tuple[tuple[str, ...], bool]]:
        return [(p.backends, p.dense) for p in plan]

    assert shares(kernels.split(every)) == [(("cpu", "flashinfer"), True), (("marlin",), False), (("triton",), False)]
    assert shares(kernels.split(every, sequential=True)) == [(every, True)]
    assert shares(kernels.split(("triton", "marlin"))) == [(("triton",), True), (("marlin",), False)]
    assert shares(kernels.split(("cpu",))) == [(("cpu",), True)]
    assert [p.label for p in kernels.split(every)] == ["cpu,flashinfer", "marlin", "triton"]


# One process of the check: it answers for the backends and token counts it got, and the dense layer if asked.
SPLIT_CHECK = """
import json, sys
payload = json.loads(sys.stdin.readline())
rows = [{"layer": "moe", "backend": name, "tokens": t, "rel_error": 0.004} for name in payload["backends"]
        if name in ("marlin", "triton") for t in payload["tokens"]]
missing = [{"layer": "moe", "backend": name, "reason": "here: " + name} for name in payload["backends"]
           if name not in ("marlin", "triton")]
if payload["dense"]:
    rows.insert(0, {"layer": "qkv", "backend": "cublas", "tokens": 1, "rel_error": 0.001})
phases = {"start": 1.0, "moe weights and reference": 2.0, **{"moe %s runs" % n: 3.0 for n in payload["backends"]},
          **({"dense": 0.5} if payload["dense"] else {})}
print(json.dumps({"device": "GPU", "vllm": "0.20.2", "torch": "2.x", "results": rows, "not_run": missing,
                  "skipped": [], "phases": phases, "seconds": 9.0}))
"""


def test_the_processes_reports_merge_dense_first_then_each_backend_and_token_count_in_the_order_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = kernel_check_script(SPLIT_CHECK, tmp_path, monkeypatch)
    shape = kernels.layer_shape("x", "20b")
    report = kernels.run(sys.executable, shape, tokens=(8, 1), repeat=2, backends=("triton", "cpu", "marlin"))
    assert [(r["layer"], r["backend"], r["tokens"]) for r in report.results] == [
        ("qkv", "cublas", 1), ("moe", "triton", 8), ("moe", "triton", 1), ("moe", "marlin", 8), ("moe", "marlin", 1),
    ]  # fmt: skip - the dense layer once (only the first process checks it), then the backends and counts as asked
    assert [row["backend"] for row in report.not_run] == ["cpu"]
    assert report.phases["moe weights and reference (marlin)"] == 2.0 and report.phases["process triton"] == 9.0
    assert {"moe marlin runs", "start (cpu)", "dense"} <= set(report.phases)
    together = kernels.run(sys.executable, shape, tokens=(1,), repeat=2, backends=("triton", "marlin"), sequential=True)
    assert [r["backend"] for r in together.results] == ["cublas", "triton", "marlin"]
    assert together.phases["start"] == 1.0 and not any(name.startswith("process") for name in together.phases)
    script.write_text(SPLIT_CHECK + "if 'marlin' in payload['backends']: sys.exit('Marlin died')\n")
    with pytest.raises(TargetError, match=r"the kernel check failed in .* \(exit 1\): Marlin died"):
        kernels.run(sys.executable, shape, backends=("triton", "marlin"))

ANSWER = {
    "choices": [
        {
            "text": " the light",
            "prompt_logprobs": [
                None,
                {"17": {"logprob": -2.5, "rank": 3, "decoded_token": "a"}, "9": {"logprob": -0.1, "rank": 1}},
                {"4": {"logprob": -0.3, "rank": 1, "decoded_token": "b"}},
            ],
        }
    ]
}


def test_a_completion_gives_the_prompt_tokens_logprobs_the_top1_and_the_greedy_text() -> None:
    result = served.parse_completion(ANSWER)
    assert result == served.PromptResult(logprobs=(-2.5, -0.3), top1=(9, 4), greedy=" the light")
    body = served.completion_body("/m", "hello", 32)
    assert body["prompt_logprobs"] == 1 and body["temperature"] == 0 and body["max_tokens"] == 32


def result(logprobs: tuple[float, ...], top1: tuple[int, ...], greedy: str) -> served.PromptResult:
    return served.PromptResult(logprobs, top1, greedy)


def test_two_passes_compare_to_median_max_top1_and_greedy() -> None:
    a = served.Pass("profile", 1, (result((-1.0, -2.0), (1, 2), "x"), result((-3.0,), (5,), "y")), 0.1)
    b = served.Pass("profile", 2, (result((-1.5, -2.0), (1, 3), "x"), result((-3.25,), (5,), "z")), 0.1)
    agreement = served.compare(a, b)
    assert (agreement.positions, agreement.median_abs, agreement.max_abs) == (3, 0.25, 0.5)
    assert agreement.top1_same == pytest.approx(2 / 3) and agreement.greedy_same == 1 and agreement.same_server
    same = served.compare(a, a)
    assert (same.median_abs, same.max_abs, same.top1_same, same.greedy_same) == (0.0, 0.0, 1.0, 2)
    v1, v2 = served.Pass("vanilla", 1, a.prompts, 0.1), served.Pass("vanilla", 2, a.prompts, 0.1)
    pairs = [(x.first, x.second) for x in served.agreements([a, v1, b, v2])]
    assert pairs == [("profile#1", "profile#2"), ("vanilla#1", "vanilla#2"), ("profile#1", "vanilla#1")]
    assert served.agreements([a, v1, b, v2])[2].to_json()["same_server"] is False


def test_a_pass_sends_every_prompt_in_order_and_a_failed_request_is_the_servers_failure() -> None:
    seen: list[str] = []

    def send(url: str, body: dict) -> dict:
        seen.append(body["prompt"])
        assert url == "http://127.0.0.1:8000/v1/completions" and body["model"] == "/m"
        return {"choices": [{"text": body["prompt"].upper(), "prompt_logprobs": [None]}]}

    done = served.one_pass(SPEC, 1, ["a", "b", "c"], max_tokens=4, parallel=2, send=send)
    assert [p.greedy for p in done.prompts] == ["A", "B", "C"] and sorted(seen) == ["a", "b", "c"]

    def broken(url: str, body: dict) -> dict:
        raise ConnectionResetError("reset by peer")

    with pytest.raises(BenchFailed, match=r"profile server .* a completion request failed: ConnectionResetError"):
        served.one_pass(SPEC, 1, ["a"], max_tokens=4, parallel=1, send=broken)
    assert len(served.PROMPTS) == 8 and len(set(served.PROMPTS)) == 8


def render_to_text(monkeypatch: pytest.MonkeyPatch, draw) -> str:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from gptoss_patch import render

    monkeypatch.setenv("COLUMNS", "80")  # the width tables fit (render.width); the console below is 80 wide too
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, color_system=None, force_terminal=False)
    monkeypatch.setattr(render, "out", console)
    monkeypatch.setattr(render, "err", console)
    draw()
    return buffer.getvalue()


def test_the_tables_fit_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from gptoss_patch.numerics import render as tables

    shape = kernels.layer_shape("x", "20b")
    rows = [
        {"layer": layer, "backend": backend, "tokens": n, "rel_error": 0.0123, "max_abs_error": 0.5, "runs": 3,
         "max_run_diff": diff, "batch_diff": None if n == 1 else diff}
        for layer, backend in (("router", "cublas"), ("moe", "marlin"), ("moe", "triton"))
        for n in (1, 8, 64, 512) for diff in (0.0, 0.0078125)
    ]  # fmt: skip
    missing = [{"layer": "moe", "backend": "flashinfer", "reason": "not compiled"}]
    phases = {"dense": 1.5, "moe weights and reference": 2.0, "moe marlin": 9.5, "moe triton": 21.0}
    report = kernels.KernelReport("NVIDIA H100 80GB HBM3", "0.20.2", "2.11", rows, missing, [], shape, 41.0, phases=phases)
    text = render_to_text(monkeypatch, lambda: tables.kernel_table(report))
    assert "┃ layer" in text and "7.81e-03" in text and "same x3" in text
    assert "not run: moe flashinfer: not compiled" in text
    assert "moe triton 21 s" in " ".join(text.split()) and report.to_json()["phases"] == phases
    assert max(len(line) for line in text.splitlines()) <= 80
    a = served.Pass("profile", 1, (result((-1.0,), (1,), "x"),), 0.1)
    b = served.Pass("vanilla", 1, (result((-1.37,), (2,), "y"),), 0.1)
    summary = served.ServedReport(
        [{"name": "profile", "command": [], "ready_seconds": 20.0, "log": "/l/profile.log"}],
        served.agreements([a, a, b, b]), 8, 32, 8, 60.0,
    )
    text = render_to_text(monkeypatch, lambda: tables.served_table(summary))
    assert "profile#1 ~ vanilla#1" in text and "0.37" in text and "0/1" in text
    assert max(len(line) for line in text.splitlines()) <= 80


# -- launcher/reproducibility.py ----------------------------------------------------------------------------


def plan(profile: str, *settings: Setting, extra: tuple[str, ...] = ()) -> LaunchPlan:
    return LaunchPlan(
        installation=None, executable=Path("/v/bin/vllm"), model="/m", profile=profile, profile_source="--gpu",
        settings=settings, notes=(), extra_args=extra, base_env={},
    )  # fmt: skip


MARLIN = Setting.flag("--moe-backend", "marlin", why="SM90: faster")
PIN_ENV = Setting.env("VLLM_MXFP4_USE_MARLIN", "1", why="SM12x pin")


def test_marlin_on_sm90_is_a_warning_that_names_both_properties_given_up_and_the_fix() -> None:
    (check,) = reproducibility.checks(plan("sm90", MARLIN))
    assert check.name == "reproducibility" and check.status is Status.WARN
    assert check.message.startswith("--fast-moe (Marlin's MoE kernel) gives up accuracy (1.5× the kernel error against float64")
    assert "and run-to-run reproducibility of the prompt pass" in check.message
    assert "drop --fast-moe" in check.fix and "-- --moe-backend triton" in check.fix
    assert reproducibility.checks(plan("sm90", MARLIN, extra=("--moe-backend", "triton"))) == ()
    assert reproducibility.checks(plan("sm90")) == () and reproducibility.checks(plan("cpu")) == ()


def test_the_users_own_marlin_warns_too_and_sm12x_is_told_one_request_at_a_time() -> None:
    (mine,) = reproducibility.checks(plan("cpu", extra=("--moe-backend", "marlin")))
    assert mine.message.startswith("your --moe-backend marlin gives up accuracy")
    assert mine.fix == "-- --moe-backend triton (vLLM's Triton MXFP4 kernel) instead of marlin"
    (pinned,) = reproducibility.checks(plan("sm121", PIN_ENV))
    assert pinned.message.startswith("the sm121 profile's Marlin MoE kernel gives up accuracy")
    assert pinned.fix.startswith("-- --max-num-seqs 1 (one request at a time")
