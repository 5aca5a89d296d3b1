"""gptoss_patch.numerics without vLLM: the layer shape, the kernel report read back, the server comparisons, the
tables at 80 columns; and launcher/reproducibility.py (the reproducibility row wherever Marlin runs) on plain plans."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gptoss_patch import model as models, target
from gptoss_patch.bench.spec import BenchFailed, ServerSpec
from gptoss_patch.errors import TargetError, UsageError
from gptoss_patch.launcher import reproducibility
from gptoss_patch.launcher.results import LaunchPlan, Setting, Status
from gptoss_patch.numerics import kernel_check, kernels, served
from tests.launcher.recorded import facts
from tests.support import harness, measured

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
    with pytest.raises(UsageError, match=r"config.json: model_type .llama. is not gpt-oss"):
        kernels.layer_shape(str(other), None)


def test_token_counts_and_backends_are_checked() -> None:
    assert kernels.parse_tokens("1,8,64,512,8") == (1, 8, 64, 512)
    for bad in ("", "0", "a,b"):
        with pytest.raises(UsageError, match="--tokens"):
            kernels.parse_tokens(bad)
    assert kernels.parse_backends("marlin, triton") == ("marlin", "triton") and kernels.parse_backends(None) == ()
    with pytest.raises(UsageError, match="--backend cutlass: expected some of cpu, marlin, triton, flashinfer"):
        kernels.parse_backends("marlin,cutlass")


FAKE_CHECK = f"ANSWER = {target.ANSWER!r}\n" + """
import json, sys
payload = json.loads(sys.stdin.readline())
print("INFO vLLM logs to stdout too")
print(ANSWER + json.dumps({"device": "cpu", "vllm": "0.17.1", "torch": "2.x", "echo": payload,
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
SPLIT_CHECK = f"ANSWER = {target.ANSWER!r}\n" + """
import json, sys
payload = json.loads(sys.stdin.readline())
rows = [{"layer": "moe", "backend": name, "tokens": t, "rel_error": 0.004} for name in payload["backends"]
        if name in ("marlin", "triton") for t in payload["tokens"]]
missing = [{"layer": "moe", "backend": name, "reason": "here: " + name} for name in payload["backends"]
           if name not in ("marlin", "triton")]
if payload["dense"]:
    rows.insert(0, {"layer": "qkv", "backend": "cublas", "tokens": 1, "rel_error": 0.001})
# every process that runs a MoE backend computes the same MoE floor; only the dense one the dense floors
running = [name for name in payload["backends"] if name in ("marlin", "triton")]
floors = [{"layer": "moe", "tokens": t, "rel_error": 0.0045, "process": running[0]} for t in payload["tokens"] if running]
floors += [{"layer": "qkv", "tokens": 1, "rel_error": 0.001}] if payload["dense"] else []
phases = {"start": 1.0, "moe weights and reference": 2.0, **{"moe %s runs" % n: 3.0 for n in payload["backends"]},
          **({"dense": 0.5} if payload["dense"] else {})}
print(ANSWER + json.dumps({"device": "GPU", "vllm": "0.20.2", "torch": "2.x", "results": rows, "not_run": missing,
                  "skipped": [], "phases": phases, "seconds": 9.0, "floors": floors}))
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
    # one floor per layer and token count, the dense layer's first, whichever processes computed it
    assert [(f["layer"], f["tokens"], f["process"] if f["layer"] == "moe" else None) for f in report.floors] == [
        ("qkv", 1, None), ("moe", 8, "triton"), ("moe", 1, "triton"),
    ]  # fmt: skip
    document = report.to_json()
    assert document["floor_multiple"] == kernels.FLOOR_MULTIPLE and document["floors"] == report.floors
    assert [(v["layer"], v["backend"], v["passed"]) for v in document["gate"]] == [
        ("qkv", "cublas", True), ("moe", "triton", True), ("moe", "marlin", True),
    ]  # fmt: skip
    assert report.phases["moe weights and reference (marlin)"] == 2.0 and report.phases["process triton"] == 9.0
    assert {"moe marlin runs", "start (cpu)", "dense"} <= set(report.phases)
    together = kernels.run(sys.executable, shape, tokens=(1,), repeat=2, backends=("triton", "marlin"), sequential=True)
    assert [r["backend"] for r in together.results] == ["cublas", "triton", "marlin"]
    assert together.phases["start"] == 1.0 and not any(name.startswith("process") for name in together.phases)
    script.write_text(SPLIT_CHECK + "if 'marlin' in payload['backends']: sys.exit('Marlin died')\n")
    with pytest.raises(TargetError, match=r"the kernel check failed in .* \(exit 1\): Marlin died"):
        kernels.run(sys.executable, shape, backends=("triton", "marlin"))

def row(backend: str, tokens: int, rel_error: float, run_diff: float = 0.0, batch_diff: float | None = 0.0) -> dict:
    return {"layer": "moe", "backend": backend, "tokens": tokens, "rel_error": rel_error, "max_abs_error": 0.2,
            "runs": 3, "max_run_diff": run_diff, "batch_diff": None if tokens == 1 else batch_diff}  # fmt: skip


# The floor as issue #38 measured it on an H100 (20b shape): exact bf16 4.43-4.94e-3; a step of 0.125 over a batch
# whose largest output is 16-32, 0.0625 over a first token whose largest is 8-16.
FLOORS = [
    {"layer": "moe", "tokens": n, "rel_error": floor, "max_abs_error": 0.2, "step": 0.125, "step_first": 0.0625}
    for n, floor in ((1, 4.94e-3), (8, 4.43e-3), (64, 4.5e-3), (512, 4.5e-3))
]  # fmt: skip


def test_the_gate_passes_a_kernel_within_the_floor_multiple_at_every_count_and_within_a_bf16_step() -> None:
    marlin = [row("marlin", 1, 5.57e-3), row("marlin", 8, 4.97e-3, batch_diff=3.12e-2),
              row("marlin", 64, 5.0e-3, batch_diff=1.56e-2), row("marlin", 512, 5.01e-3, 6.25e-2, 7.81e-3)]  # fmt: skip
    triton = [row("triton", n, 3.3e-3) for n in (1, 8, 64, 512)]
    verdicts = kernels.gate(marlin + triton, FLOORS)
    assert [(v.backend, v.passed, v.failures) for v in verdicts] == [("marlin", True, ()), ("triton", True, ())]
    assert verdicts[0].worst_ratio == pytest.approx(5.57e-3 / 4.94e-3) and verdicts[0].worst_step == pytest.approx(0.5)
    assert verdicts[1].worst_ratio == pytest.approx(3.3e-3 / 4.43e-3) and verdicts[1].worst_step == 0.0
    assert kernels.floor_ratio(marlin[1], FLOORS) == pytest.approx(4.97 / 4.43)
    shown = kernels.against_floor(marlin[3], FLOORS)  # what --json says beside each result
    assert shown["floor_ratio"] == pytest.approx(5.01 / 4.5) and shown["rel_error"] == 5.01e-3
    assert (shown["run_diff_steps"], shown["batch_diff_steps"]) == pytest.approx((0.5, 0.125), rel=1e-3)
    assert kernels.against_floor(row("k", 2, 1e-3), FLOORS)["floor_ratio"] is None


def test_the_gate_fails_one_count_over_the_multiple_a_batch_or_rerun_difference_over_a_step_or_no_floor() -> None:
    over = kernels.FLOOR_MULTIPLE * 4.43e-3 * 1.01  # just over the multiple, at 8 tokens only
    (verdict,) = kernels.gate([row("k", 1, 4.9e-3), row("k", 8, over)], FLOORS)
    assert not verdict.passed and len(verdict.failures) == 1
    assert verdict.failures[0].startswith("8 tokens: error ") and "(at most 1.25x)" in verdict.failures[0]
    (exact,) = kernels.gate([row("k", 8, kernels.FLOOR_MULTIPLE * 4.43e-3)], FLOORS)
    assert exact.passed  # at the multiple: passes
    # the batch difference is held to the first token's step (0.0625), not the batch's (0.125)
    (batch,) = kernels.gate([row("k", 64, 4.5e-3, batch_diff=0.1)], FLOORS)
    assert batch.failures == ("64 tokens: alone and inside the batch differ by 0.1, more than one bf16 step 0.0625",)
    (rerun,) = kernels.gate([row("k", 512, 4.5e-3, run_diff=0.25)], FLOORS)
    assert rerun.failures == ("512 tokens: rerun to rerun differ by 0.25, more than one bf16 step 0.125",)
    assert kernels.gate([row("k", 64, 4.5e-3, run_diff=0.125, batch_diff=0.0625)], FLOORS)[0].passed  # one step: passes
    (missing,) = kernels.gate([row("k", 2, 1e-3)], FLOORS)
    assert missing.failures == ("2 tokens: no exact-bf16 floor to compare with",) and missing.worst_ratio is None


def test_a_bf16_step_is_one_unit_in_the_last_place_at_the_magnitude() -> None:
    assert kernel_check.bf16_ulp(1.0) == 2**-7 and kernel_check.bf16_ulp(-1.99) == 2**-7
    assert kernel_check.bf16_ulp(29.0) == 0.125 and kernel_check.bf16_ulp(32.0) == kernel_check.bf16_ulp(53.0) == 0.25
    assert kernel_check.bf16_ulp(0.0) == 0.0 and kernel_check.bf16_ulp(float("nan")) == 0.0
    assert kernel_check.bf16_ulp(1e-45) == 2**-133  # below bf16's normal range: its subnormal spacing


# Runs in a torch interpreter (the CPU harness venv): kernel_check's floor math against a mirror of it in plain
# Python (math.fsum sums, struct's float32, round-half-even on 8 significant bits), on a small random layer.
FLOOR_MIRROR = r"""
import importlib.util, json, math, struct, sys
import torch
spec = importlib.util.spec_from_file_location("kernel_check", sys.argv[1])
kc = importlib.util.module_from_spec(spec); spec.loader.exec_module(kc)

def bf16(x):  # float64 -> bf16, to nearest, ties to even
    if x == 0.0: return x
    m, e = math.frexp(x)
    return math.ldexp(round(m * 256), e - 8)

def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]

checks = {}
ties = [1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-40), 1 + 3 * 2**-8 - 2**-40]
gen = torch.Generator().manual_seed(7)
values = torch.cat([torch.tensor(ties, dtype=torch.float64), torch.randn(20000, dtype=torch.float64, generator=gen) * 30])
got = kc.to_bf16(torch, values).double().tolist()
checks["to_bf16 wrong"] = [(v, g) for v, g in zip(values.tolist(), got) if g != bf16(v)]
checks["torch's own conversion wrong at"] = [v for v in ties if torch.tensor([v], dtype=torch.float64).to(torch.bfloat16).double().item() != bf16(v)]

shape = {"hidden_size": 64, "intermediate_size": 32, "num_local_experts": 4, "experts_per_token": 2, "swiglu_limit": 7.0}
layer = kc.make_weights(torch, shape, (118, 122), "cpu", seed=3)
layer64 = {**layer, "b13": layer["b13"].double(), "b2": layer["b2"].double()}
x = (torch.randn(5, 64, generator=gen) * 3).to(torch.bfloat16)
logits = torch.randn(5, 4, generator=gen)
ref, floor = kc.reference_moe(torch, x, logits, layer64, 2, 7.0)
weights, ids = kc.route(torch, logits, 2)
w13 = kc.dequantize(torch, layer["w13_blocks"], layer["w13_scales"]).tolist()
w2 = kc.dequantize(torch, layer["w2_blocks"], layer["w2_scales"]).tolist()
b13, b2 = layer64["b13"].tolist(), layer64["b2"].tolist()
mirror = []
for t, row in enumerate(x.double().tolist()):
    total = [0.0] * 64
    for slot in range(2):
        e = int(ids[t, slot])
        h = [bf16(math.fsum([a * w for a, w in zip(row, w13[e][j])] + [b13[e][j]])) for j in range(64)]
        act = []
        for j in range(32):
            gate, up = min(h[2 * j], 7.0), max(min(h[2 * j + 1], 7.0), -7.0)
            act.append(bf16(gate / (1 + math.exp(-1.702 * gate)) * (up + 1)))
        y = [bf16(math.fsum([a * w for a, w in zip(act, w2[e][j])] + [b2[e][j]])) for j in range(64)]
        weight = float(weights[t, slot])
        total = [f32(s + f32(weight * v)) if slot else f32(weight * v) for s, v in zip(total, y)]
    mirror.append([bf16(v) for v in total])
checks["floor differs from the mirror at"] = [(t, j) for t in range(5) for j in range(64) if floor[t, j].item() != mirror[t][j]]
row = kc.floor_row(torch, "moe", floor, ref)
once = kc.floor_row(torch, "moe", kc.to_bf16(torch, ref), ref)  # the exact result rounded once: below the floor
checks["row"] = row
checks["rounded once"] = once["rel_error"]
checks["steps"] = [kc.bf16_ulp(floor.double().abs().max().item()), kc.bf16_ulp(floor[0].double().abs().max().item())]
print(json.dumps(checks))
"""


@pytest.mark.harness
def test_the_exact_bf16_floor_is_bf16_arithmetic_rounded_where_the_kernels_round() -> None:
    python = harness.cpu_venv("0.17.1")  # any interpreter with torch: the floor math is plain torch
    proc = subprocess.run(
        [str(python), "-c", FLOOR_MIRROR, kernel_check.__file__], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = json.loads(proc.stdout.splitlines()[-1])
    assert checks["to_bf16 wrong"] == []  # correctly rounded, the ties included
    wrong = [1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-40), 1 + 3 * 2**-8 - 2**-40]  # rounded twice, through float32
    assert checks["torch's own conversion wrong at"] == wrong  # why to_bf16 exists
    assert checks["floor differs from the mirror at"] == []  # bitwise the mirror's, every output of every token
    row = checks["row"]
    assert row["layer"] == "moe" and row["tokens"] == 5 and row["max_abs_error"] > 0
    assert row["rel_error"] > checks["rounded once"] > 0  # the intermediates' roundings add to the output's
    assert [row["step"], row["step_first"]] == checks["steps"] and row["step"] >= row["step_first"] > 0


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
    floors = [
        {"layer": layer, "tokens": n, "rel_error": 0.0100, "max_abs_error": 0.25, "step": 0.125, "step_first": 0.0625}
        for layer in ("router", "moe") for n in (1, 8, 64, 512)
    ]  # fmt: skip
    report = kernels.KernelReport(
        "NVIDIA H100 80GB HBM3", "0.20.2", "2.11", rows, missing, [], shape, 41.0, phases=phases, floors=floors
    )
    text = render_to_text(monkeypatch, lambda: tables.kernel_table(report))
    assert "┃ layer" in text and "7.81e-03" in text and "same x3" in text
    lines = text.splitlines()
    floor_rows = [line for line in lines if "│ floor" in line]  # each layer's floor, once per token count
    assert len(floor_rows) == 8 and "│ ≤2^-3 " in floor_rows[-1] and "│ ≤2^-4 " in floor_rows[-1]
    assert "│ 1.23 " in text  # x floor: 0.0123 over 0.0100
    flat = " ".join(text.split())
    assert "gate: router cublas passes; worst 1.23x the floor, differences at most 0.12 of a bf16 step" in flat
    assert "gate: moe marlin passes" in flat and "gate: moe triton passes" in flat
    assert "not run: moe flashinfer: not compiled" in text
    assert "moe triton 21 s" in " ".join(text.split()) and report.to_json()["phases"] == phases
    assert "kernel libraries" not in text  # none read: no line
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
    """A plan with vLLM 0.20.2's recorded capabilities: its MXFP4 selector honours --moe-backend and reads
    VLLM_MXFP4_USE_MARLIN, so both ways of naming Marlin count."""
    return LaunchPlan(
        installation=None, executable=Path("/v/bin/vllm"), model="/m", profile=profile, profile_source="--gpu",
        settings=settings, notes=(), extra_args=extra, base_env={}, patch_report=None,
        capabilities=facts("0.20.2").capabilities, options=None, vocabulary=None, parallel=None,
    )  # fmt: skip


MARLIN = Setting.flag("--moe-backend", "marlin", why="SM90: faster")
PIN_ENV = Setting.env("VLLM_MXFP4_USE_MARLIN", "1", why="SM12x pin")


def test_marlin_on_sm90_is_a_warning_that_names_both_properties_given_up_and_the_fix() -> None:
    (check,) = reproducibility.check_reproducibility(plan("sm90", MARLIN))
    assert check.name == "reproducibility" and check.status is Status.WARN
    error = measured.marlin_error_ratio()  # docs/performance.md's kernel table, not the code's constant
    assert check.message.startswith(f"--fast-moe (Marlin's MoE kernel) gives up accuracy ({error}× the kernel error against float64"), check.message
    assert "and run-to-run reproducibility of the prompt pass" in check.message
    assert "drop --fast-moe" in check.fix and "-- --moe-backend triton" in check.fix
    assert reproducibility.check_reproducibility(plan("sm90", MARLIN, extra=("--moe-backend", "triton"))) == ()
    assert reproducibility.check_reproducibility(plan("sm90")) == () and reproducibility.check_reproducibility(plan("cpu")) == ()


def test_the_users_own_marlin_warns_too_and_sm12x_is_told_one_request_at_a_time() -> None:
    (mine,) = reproducibility.check_reproducibility(plan("cpu", extra=("--moe-backend", "marlin")))
    assert mine.message.startswith("your --moe-backend marlin gives up accuracy")
    assert mine.fix == "-- --moe-backend triton (vLLM's Triton MXFP4 kernel) instead of marlin"
    (pinned,) = reproducibility.check_reproducibility(plan("sm121", PIN_ENV))
    assert pinned.message.startswith("the sm121 profile's Marlin MoE kernel gives up accuracy")
    assert pinned.fix.startswith("-- --max-num-seqs 1 (one request at a time")


def test_the_kernel_libraries_installed_beside_vllm_are_named_in_the_table_and_the_json(monkeypatch, tmp_path) -> None:
    # Issue 38 item 6, issue 37 item 10: the Triton figures name the triton / triton_kernels release they came from.
    from gptoss_patch import distinfo
    from gptoss_patch.numerics import render as tables

    site = tmp_path / "site-packages"
    for folder, name, version in (("triton-3.5.1.dist-info", "triton", "3.5.1"),
                                  ("flashinfer_python-0.5.3.dist-info", "flashinfer-python", "0.5.3")):  # fmt: skip
        (site / folder).mkdir(parents=True)
        (site / folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "vllm" / "third_party" / "triton_kernels").mkdir(parents=True)
    (site / "vllm" / "third_party" / "triton_kernels" / "__init__.py").write_text("")
    libraries = distinfo.kernel_versions(site)
    assert libraries == {"triton": "3.5.1", "triton_kernels": "vendored in vLLM", "flashinfer": "0.5.3"}
    (site / "triton_kernels-1.0.0.dist-info").mkdir()
    (site / "triton_kernels-1.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: triton_kernels\nVersion: 1.0.0\n")
    assert distinfo.kernel_versions(site)["triton_kernels"] == "1.0.0"  # vLLM imports an installed one first
    assert distinfo.kernel_versions(tmp_path / "empty")["flashinfer"] == "not installed"
    row = {"layer": "moe", "backend": "triton", "tokens": 1, "rel_error": 0.01, "max_abs_error": 0.5, "runs": 2,
           "max_run_diff": 0.0, "batch_diff": None}
    shape = kernels.layer_shape("x", "20b")
    report = kernels.KernelReport("H100", "0.20.2", "2.11", [row], [], [], shape, 1.0, libraries=libraries)
    text = " ".join(render_to_text(monkeypatch, lambda: tables.kernel_table(report)).split())
    assert "kernel libraries: triton 3.5.1, triton_kernels vendored in vLLM, flashinfer 0.5.3" in text
    assert report.to_json()["kernel_libraries"] == libraries


def test_the_kernel_table_names_the_vendored_triton_kernels_and_its_regression(monkeypatch) -> None:
    # G50: vLLM 0.17.0-0.21.0 vendor triton_kernels 3.6.0, which vllm#39236 measured > 30 % slower at batch size 1
    from gptoss_patch.numerics import render as tables

    libraries = {"triton": "3.6.0", "triton_kernels": "vendored in vLLM", "flashinfer": "0.6.8.post1"}
    row = {"layer": "moe", "backend": "triton", "tokens": 1, "rel_error": 0.01, "max_abs_error": 0.5, "runs": 2,
           "max_run_diff": 0.0, "batch_diff": None}
    shape = kernels.layer_shape("x", "20b")

    def text(vllm: str) -> str:
        report = kernels.KernelReport("H100", vllm, "2.11", [row], [], [], shape, 1.0, libraries=libraries)
        return " ".join(render_to_text(monkeypatch, lambda: tables.kernel_table(report)).split())

    slow = text("0.20.2")
    assert "triton_kernels: vLLM 0.20.2 vendors triton's v3.6.0 copy" in slow
    assert "lost more than 30 % at batch size 1 on Hopper" in slow and "G50" in slow
    fast = text("0.22.1")
    assert "vendors triton's v3.5.1 copy" in fast and "G50" not in fast
