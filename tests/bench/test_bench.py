"""gptoss_patch.bench without servers: the schedule, the arguments given to `vllm bench serve`, the figures."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gptoss_patch import bench
from gptoss_patch.errors import UsageError

WORKLOAD = bench.Workload(model="/m", concurrency=(1, 10), repeat=2, input_len=128, output_len=256, waves=2)
SPEC = bench.ServerSpec("profile", ("vllm", "serve", "/m"), {}, 8000, "/m")


def test_rounds_alternate_which_server_goes_first() -> None:
    runs = bench.schedule(["profile", "vanilla"], WORKLOAD)
    assert [(r.round, r.concurrency, r.server) for r in runs] == [
        (0, 1, "profile"), (0, 1, "vanilla"), (0, 10, "vanilla"), (0, 10, "profile"),
        (1, 1, "vanilla"), (1, 1, "profile"), (1, 10, "profile"), (1, 10, "vanilla"),
    ]  # fmt: skip
    assert len({r.id for r in runs}) == len(runs)


@pytest.mark.parametrize("concurrencies", [(1,), (1, 10), (1, 5, 10), (1, 2, 4, 8)])
@pytest.mark.parametrize("servers", [["profile", "vanilla"], ["profile", "vanilla", "recipe"]])
def test_at_every_concurrency_each_server_leads_equally_often(concurrencies: tuple[int, ...], servers: list[str]) -> None:
    """The H100 runs had the profile first at C=1 and vanilla first at C=10 in all six rounds (even count)."""
    workload = bench.Workload(model="/m", concurrency=concurrencies, repeat=2 * len(servers))
    runs = bench.schedule(servers, workload)
    for concurrency in concurrencies:
        leads = [r.server for r in runs if r.concurrency == concurrency][:: len(servers)]
        assert sorted(leads) == sorted(servers * 2), (concurrency, leads)


def test_three_servers_rotate() -> None:
    runs = bench.schedule(["profile", "vanilla", "eager"], bench.Workload(model="/m", concurrency=(1, 2, 4), repeat=1))
    firsts = [runs[i].server for i in range(0, len(runs), 3)]
    assert firsts == ["profile", "vanilla", "eager"]


def test_bench_arguments_fix_the_lengths_and_ignore_eos() -> None:
    argv = bench.bench_argv(SPEC, WORKLOAD, 10, 1)
    pairs = dict(zip(argv[::1], argv[1:]))
    assert pairs["--endpoint"] == "/v1/completions" and pairs["--dataset-name"] == "random"
    assert (pairs["--random-input-len"], pairs["--random-output-len"], pairs["--random-range-ratio"]) == (
        "128",
        "256",
        "0",
    )
    assert (pairs["--max-concurrency"], pairs["--num-prompts"], pairs["--seed"]) == ("10", "20", "1")
    assert "--ignore-eos" in argv and pairs["--base-url"] == "http://127.0.0.1:8000"
    assert bench.Workload(model="/m", waves=1, min_prompts=2).prompts(1) == 2


RESULT = {
    "completed": 20, "failed": 0, "total_input_tokens": 2560, "mean_ttft_ms": 50.0,
    "output_throughput": 1344.2, "max_output_tokens_per_s": 1500.0, "median_tpot_ms": 7.29,
}  # fmt: skip


def test_a_result_becomes_the_tables_figures() -> None:
    sample = bench.sample_from(RESULT, bench.Run("r0-c10-profile", "profile", 10, 0))
    assert sample.prefill == pytest.approx(10 * 128 / 0.05)  # streams x prompt tokens / mean TTFT
    assert (sample.generation, sample.peak, sample.tpot_ms) == (1344.2, 1500.0, 7.29)


def test_a_round_whose_first_token_stalled_is_flagged_and_tpot_gives_the_decode_ratio() -> None:
    def run(server: str, round_: int, ttft: float, generation: float, tpot: float) -> bench.Sample:
        return bench.Sample(server, 10, round_, 1.0, generation, generation, tpot, 20, 0, ttft)

    samples = [run("profile", r, 60.0, 1400.0, 6.8) for r in range(3)] + [
        run("vanilla", 0, 90.0, 1300.0, 7.3), run("vanilla", 1, 1800.0, 1150.0, 7.3), run("vanilla", 2, 110.0, 1310.0, 7.3),
    ]  # fmt: skip
    profile, vanilla = bench.summarize(samples, ["profile", "vanilla"])
    assert vanilla.ttft_outliers == (1,) and profile.ttft_outliers == ()
    assert profile.tpot_ratio == pytest.approx(7.3 / 6.8)
    assert bench.sample_from(RESULT, bench.Run("x", "vanilla", 10, 0)).ttft_ms == pytest.approx(50.0)


def test_with_two_rounds_a_stalled_round_is_flagged_and_the_ratio_says_so() -> None:
    # Measured (issue 38, 120b on two H200s, --repeat 2, C=16): vanilla's first round 795 ms to first token, its second
    # 151 ms; the profile's generation ratio read "0.695 (within spread)" where TPOT was equal.
    def run(server: str, round_: int, ttft: float, generation: float) -> bench.Sample:
        return bench.Sample(server, 16, round_, 1.0, generation, generation, 7.56, 32, 0, ttft)

    samples = [run("profile", 0, 2177.0, 900.0), run("profile", 1, 888.0, 1265.0),
               run("vanilla", 0, 795.0, 1250.0), run("vanilla", 1, 151.0, 1860.0)]  # fmt: skip
    profile, vanilla = bench.summarize(samples, ["profile", "vanilla"])
    assert vanilla.ttft_outliers == (0,) and profile.ttft_outliers == ()  # 5.3x its other round; 2.45x is not
    assert profile.within_spread is True and profile.compared_outliers == (0,)
    text = profile.ratio_text()
    assert text.startswith("0.696 (a round stalled in prefill: read TPOT)") and "within spread of" not in text
    assert text.endswith("TPOT 1.000 (within spread)")


def test_a_single_round_is_compared_with_the_other_servers_at_that_concurrency() -> None:
    samples = [bench.Sample(name, 16, 0, 1.0, 1000.0, 1000.0, 7.0, 32, 0, ttft)
               for name, ttft in (("profile", 2000.0), ("vanilla", 150.0), ("recipe", 160.0))]  # fmt: skip
    rows = {r.server: r for r in bench.summarize(samples, ["profile", "vanilla", "recipe"])}
    assert rows["profile"].ttft_outliers == (0,) and rows["vanilla"].ttft_outliers == ()
    assert rows["profile"].ratio_text() == "1.000 (a round stalled in prefill: read TPOT)\nTPOT 1.000 (within spread)"


def test_a_run_where_nothing_completed_is_an_error() -> None:
    with pytest.raises(bench.BenchFailed, match="no request completed"):
        bench.sample_from({**RESULT, "completed": 0, "failed": 20}, bench.Run("x", "vanilla", 10, 0))


def _sample(server: str, concurrency: int, round_: int, generation: float) -> bench.Sample:
    return bench.Sample(server, concurrency, round_, 100.0, generation, generation * 1.1, 1000 / generation, 4, 0)


def test_medians_spread_and_ratio() -> None:
    samples = [
        _sample("profile", 10, 0, 1440.0), _sample("profile", 10, 1, 1435.0), _sample("profile", 10, 2, 1444.0),
        _sample("vanilla", 10, 0, 1344.0), _sample("vanilla", 10, 1, 1343.0), _sample("vanilla", 10, 2, 1345.0),
        _sample("profile", 1, 0, 246.0), _sample("profile", 1, 1, 230.0), _sample("profile", 1, 2, 246.2),
        _sample("vanilla", 1, 0, 241.8), _sample("vanilla", 1, 1, 230.7), _sample("vanilla", 1, 2, 244.1),
    ]  # fmt: skip
    rows = bench.summarize(samples, ["profile", "vanilla"])
    assert [(r.concurrency, r.server) for r in rows] == [
        (1, "profile"),
        (1, "vanilla"),
        (10, "profile"),
        (10, "vanilla"),
    ]
    c10 = rows[2]
    assert c10.generation == bench.Stat(1440.0, 1435.0, 1444.0)
    assert c10.ratio == pytest.approx(1440.0 / 1344.0) and c10.within_spread is False
    assert rows[0].ratio == pytest.approx(246.0 / 241.8) and rows[0].within_spread is True  # noise
    assert rows[1].ratio is None and rows[3].ratio is None


@pytest.mark.parametrize("text", ["fast", "vanilla,turbo", ","])
def test_unknown_comparison_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        bench.parse_compare(text)


def test_comparisons_parse() -> None:
    assert bench.parse_compare("vanilla,eager,vanilla") == ("vanilla", "eager")
    assert bench.parse_compare(None) == ()
    with pytest.raises(UsageError):
        bench.check_repeat(0)


def test_a_variants_rows_carry_its_ratio_to_the_profile() -> None:
    samples = [
        _sample("profile", 1, 0, 240.0), _sample("profile", 1, 1, 238.0),
        _sample("marlin", 1, 0, 300.0), _sample("marlin", 1, 1, 290.0),
        _sample("vanilla", 1, 0, 236.0), _sample("vanilla", 1, 1, 239.0),
    ]  # fmt: skip
    rows = {r.server: r for r in bench.summarize(samples, ["profile", "vanilla", "marlin"], ["marlin"])}
    assert rows["marlin"].ratio == pytest.approx(295.0 / 239.0) and rows["marlin"].within_spread is False
    assert rows["profile"].ratio == pytest.approx(239.0 / 237.5)  # against vanilla, not the variant
    assert rows["vanilla"].ratio is None
    # Without a comparison the variant is still measured against the profile, and the profile has no ratio.
    alone = {r.server: r for r in bench.summarize(samples[:4], ["profile", "marlin"], ["marlin"])}
    assert alone["profile"].ratio is None and alone["marlin"].ratio == pytest.approx(295.0 / 239.0)


def test_variants_parse_into_names_and_shell_words() -> None:
    parsed = bench.parse_variants(["marlin=--moe-backend marlin", "attn=--attention-backend 'TRITON_ATTN'"], ())
    assert parsed == (("marlin", ("--moe-backend", "marlin")), ("attn", ("--attention-backend", "TRITON_ATTN")))
    assert bench.parse_variants([], ("vanilla",)) == ()


@pytest.mark.parametrize(
    "texts",
    [
        ["--moe-backend marlin"],
        ["Marlin=--x"],
        ["a=--x", "a=--y"],
        ["vanilla=--x"],
        ["profile=--x"],
        ["a="],
        ["a='--x"],
    ],
)
def test_a_bad_variant_is_a_usage_error(texts: list[str]) -> None:
    with pytest.raises(UsageError, match="--variant"):
        bench.parse_variants(texts, ())


# A server that logs a line, then exits with the out-of-memory line once `die` exists (within 0.05 s: well inside
# the second _drive waits before it looks), and a `vllm bench serve` driver that makes `die` and reports the run in
# which every request failed.
SERVER = """
import pathlib, sys, time
print("INFO engine ready", flush=True)
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 962.00 MiB", flush=True)
sys.exit(1)
"""
DRIVER = """
import json, pathlib, sys, time
sys.stdin.readline()
time.sleep(0.3)  # the benchmark has started: the server is seen alive first
if sys.argv[1] != "-":
    pathlib.Path(sys.argv[1]).touch()
print(json.dumps({"id": "r0-c16-recipe", "result": {"completed": 0, "failed": 32}}), flush=True)
"""


@pytest.mark.parametrize("dies", [True, False])
def test_a_run_where_every_request_failed_names_the_server_and_its_last_lines(dies: bool, tmp_path: Path) -> None:
    from gptoss_patch.bench import session

    die = tmp_path / "die"
    spec = bench.ServerSpec("recipe", (sys.executable, "-c", SERVER, str(die)), dict(os.environ), 8301, "/m")
    server = bench.RunningServer(spec, tmp_path / "recipe.log")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(die) if dies else "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        while not server.tail:  # the server has logged its first line
            time.sleep(0.05)
        with pytest.raises(bench.BenchFailed) as caught:
            session._drive(driver, [{"id": "r0-c16-recipe"}], {"r0-c16-recipe": bench.Run("r0-c16-recipe", "recipe", 16, 0)},
                           [server], 30.0, lambda _: None)  # fmt: skip
    finally:
        server.stop()
        driver.wait(10)
        assert driver.stdout is not None
        driver.stdout.close()
    failed = "recipe at concurrency 16: no request completed (32 failed)"
    if dies:
        assert str(caught.value) == f"recipe server (http://127.0.0.1:8301) died during the benchmark (exit code 1); {failed}"
        assert "CUDA out of memory" in caught.value.last_lines[-1]
    else:
        assert str(caught.value) == failed and caught.value.last_lines == ("INFO engine ready",)
    assert caught.value.log_file == tmp_path / "recipe.log"


def test_every_concurrency_is_warmed_up_untimed_before_round_one_unless_turned_off() -> None:
    # Issue 38 (g): the Triton servers' first round at 16 and 64 streams had 2-8x the time to first token of the second.
    runs = bench.warmups(["profile", "vanilla"], WORKLOAD)
    assert [(r.server, r.concurrency, r.round) for r in runs] == [
        ("profile", 1, -1), ("vanilla", 1, -1), ("profile", 10, -1), ("vanilla", 10, -1),
    ]  # fmt: skip
    argv = bench.bench_argv(SPEC, bench.warmup(WORKLOAD), 10, 0)
    assert argv[argv.index("--num-prompts") + 1] == "10" and argv[argv.index("--random-output-len") + 1] == "16"
    assert "untimed warm-up at each concurrency (1, 10" in bench.warmup_note(WORKLOAD)
    off = dataclasses.replace(WORKLOAD, warm_up=False)
    assert [(r.server, r.concurrency) for r in bench.warmups(["profile"], off)] == [("profile", 1)]
    assert "--no-warm-up" in bench.warmup_note(off)


def test_a_variants_own_preflight_rows_are_shown_under_its_name() -> None:
    # Issue 38 (c): `bench --variant dp2="-dp 2"` pre-flighted only the base layout; each variant's launch now goes
    # through prepare() too, and the rows the base does not already show are the variant's.
    from gptoss_patch.bench.launch import variant_checks
    from gptoss_patch.launcher.results import Check, Status

    shared = Check("patches", Status.PASS, "all applied")
    base = (shared, Check("memory", Status.PASS, "estimated per GPU: weights 60.8 GiB ...", issue="G37"))
    mine = (shared, Check("memory", Status.FAIL, "estimated per GPU: weights 32.4 GiB ... more than", issue="G37"))
    [row] = variant_checks(base, "dp2", mine)
    assert row.status is Status.FAIL and row.issue == "G37" and row.message.startswith("--variant dp2: estimated per GPU")
    assert variant_checks(base, "same", base) == ()
