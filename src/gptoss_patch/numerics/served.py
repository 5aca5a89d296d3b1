"""The server level of `gptoss-patch numerics`: the same prompts to every server, twice, with prompt logprobs and a
greedy generation; then every pair of passes compared (a server against itself is the floor).

The servers are bench's (bench/launch.py builds them from the launcher's plan; bench/servers.py starts, watches
and stops them). Requests go through launcher/http.py's opener (never a proxy) to the completions endpoint:
`prompt_logprobs: 1` gives, at every prompt position, the logprob of the prompt's own token and the model's
top-1 token; `temperature: 0` and `max_tokens` give the greedy continuation. A pass sends its prompts
`parallel` at a time (all at once by default, as a server sees traffic: the batch each prompt lands in is then
up to the scheduler, which is what the H100 observation was about).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptoss_patch.bench.spec import BenchFailed, ServerSpec

# Eight fixed prompts (about 40 tokens each with o200k): prose, code, lists, numbers; nothing model-specific.
PROMPTS = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting each of the one hundred and "
    "twelve steps, and wondered whether the ships far out at sea ever noticed",
    "def merge_sorted(left, right):\n    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            result.append(left[i])",
    "Ingredients for the bread: 500 g flour, 350 ml water, 10 g salt, 5 g dried yeast. Mix everything, knead for "
    "ten minutes, leave it to rise for two hours and then",
    "In 1887 the committee met in Geneva to agree on a common set of rules; the minutes record that the French "
    "delegate objected twice before the final vote, which passed by",
    "Q: A train leaves at 14:05 and arrives at 17:50. How long is the journey?\nA: Let us count the hours and the "
    "minutes separately. From 14:05 to 17:05 is",
    "SELECT customer_id, SUM(amount) AS total FROM orders WHERE created_at >= '2024-01-01' GROUP BY customer_id "
    "HAVING SUM(amount) > 1000 ORDER BY total DESC LIMIT",
    "Dear team, thank you all for the hard work during the migration last weekend. A short summary of what went "
    "well, what did not, and what we will change next time:",
    "The mitochondrion is an organelle found in most eukaryotic cells. It produces most of the cell's supply of "
    "adenosine triphosphate, which is used as a source of",
)
MAX_TOKENS = 32
REQUEST_TIMEOUT = 300.0


@dataclass(frozen=True)
class PromptResult:
    """One prompt's answer: per prompt position (after the first) the prompt token's logprob and the top-1 id."""

    logprobs: tuple[float, ...]
    top1: tuple[int | None, ...]
    greedy: str


@dataclass(frozen=True)
class Pass:
    server: str
    index: int  # 1 or 2
    prompts: tuple[PromptResult, ...]
    seconds: float


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "prompt_logprobs": 1,
        "seed": 0,
    }  # fmt: skip


def parse_completion(answer: dict[str, Any]) -> PromptResult:
    """From vLLM's completion answer: the prompt's own-token logprobs, the top-1 token ids, the greedy text."""
    choice = (answer.get("choices") or [{}])[0]
    positions = choice.get("prompt_logprobs") or answer.get("prompt_logprobs") or []
    logprobs: list[float] = []
    top1: list[int | None] = []
    for entry in positions:
        if not entry:
            continue  # the first position has none
        ranked = {int(token): info for token, info in entry.items()}
        # The prompt's own token is the entry whose rank may be anything; the top-1 has rank 1. With
        # prompt_logprobs 1 there are one or two entries; the prompt token is the first vLLM lists.
        own = next(iter(entry.values()))
        logprobs.append(float(own["logprob"]))
        top1.append(next((token for token, info in ranked.items() if info.get("rank") == 1), None))
    return PromptResult(tuple(logprobs), tuple(top1), str(choice.get("text") or ""))


def post(url: str, body: dict[str, Any], timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    from gptoss_patch.launcher import http

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with http.opener_for(url).open(request, timeout=timeout) as response:
        answer = json.loads(response.read().decode("utf-8"))
    if not isinstance(answer, dict):
        raise ValueError(f"unexpected answer from {url}")
    return answer


def one_pass(
    spec: ServerSpec, index: int, prompts: Sequence[str], *, max_tokens: int, parallel: int,
    send: Callable[[str, dict[str, Any]], dict[str, Any]] = post,
) -> Pass:  # fmt: skip
    """Every prompt to `spec`'s server, `parallel` requests at a time; results in prompt order."""
    url = spec.url + "/v1/completions"
    results: list[PromptResult | None] = [None] * len(prompts)
    errors: list[str] = []
    started = time.monotonic()

    def worker(indices: list[int]) -> None:
        for i in indices:
            try:
                results[i] = parse_completion(send(url, completion_body(spec.served_model, prompts[i], max_tokens)))
            except Exception as exc:  # noqa: BLE001 - reported below as the server's failure
                errors.append(f"{type(exc).__name__}: {exc}")

    lanes = max(1, min(parallel, len(prompts)))
    threads = [threading.Thread(target=worker, args=(list(range(lane, len(prompts), lanes)),)) for lane in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors or any(result is None for result in results):
        raise BenchFailed(f"{spec.name} server ({spec.url}): a completion request failed: {errors[0] if errors else '?'}")
    return Pass(spec.name, index, tuple(r for r in results if r is not None), round(time.monotonic() - started, 2))


@dataclass(frozen=True)
class Agreement:
    """Two passes compared: |Δ logprob| over every prompt position, top-1 agreement, greedy exact matches."""

    first: str  # "profile#1"
    second: str  # "profile#2" or "vanilla#1"
    positions: int
    median_abs: float
    max_abs: float
    top1_same: float  # fraction of positions
    greedy_same: int
    prompts: int

    @property
    def same_server(self) -> bool:
        return self.first.split("#")[0] == self.second.split("#")[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first, "second": self.second, "same_server": self.same_server, "positions": self.positions,
            "median_abs_logprob_diff": self.median_abs, "max_abs_logprob_diff": self.max_abs,
            "top1_agreement": self.top1_same, "greedy_exact": self.greedy_same, "prompts": self.prompts,
        }  # fmt: skip


def compare(a: Pass, b: Pass) -> Agreement:
    diffs: list[float] = []
    same_top = total_top = greedy = 0
    for left, right in zip(a.prompts, b.prompts, strict=True):
        diffs += [abs(x - y) for x, y in zip(left.logprobs, right.logprobs)]
        pairs = list(zip(left.top1, right.top1))
        total_top += len(pairs)
        same_top += sum(1 for x, y in pairs if x is not None and x == y)
        greedy += int(left.greedy == right.greedy)
    return Agreement(
        first=f"{a.server}#{a.index}", second=f"{b.server}#{b.index}", positions=len(diffs),
        median_abs=statistics.median(diffs) if diffs else 0.0, max_abs=max(diffs, default=0.0),
        top1_same=same_top / total_top if total_top else 1.0, greedy_same=greedy, prompts=len(a.prompts),
    )  # fmt: skip


def agreements(passes: Sequence[Pass]) -> list[Agreement]:
    """Each server's two passes against each other (the floor), then every server's first pass against every
    other's (the profile first)."""
    by_server: dict[str, list[Pass]] = {}
    for p in passes:
        by_server.setdefault(p.server, []).append(p)
    out = [compare(runs[0], runs[1]) for runs in by_server.values() if len(runs) > 1]
    names = list(by_server)
    for i, left in enumerate(names):
        for right in names[i + 1 :]:
            out.append(compare(by_server[left][0], by_server[right][0]))
    return out


@dataclass(frozen=True)
class ServedReport:
    servers: list[dict[str, Any]]
    agreements: list[Agreement]
    prompts: int
    max_tokens: int
    parallel: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "servers": self.servers, "prompts": self.prompts, "max_tokens": self.max_tokens, "parallel": self.parallel,
            "agreements": [a.to_json() for a in self.agreements], "seconds": self.seconds,
        }  # fmt: skip


def run(
    specs: Sequence[ServerSpec], *, log_dir: Path, start_timeout: float, notify: Callable[[str], None],
    prompts: Sequence[str] = PROMPTS, max_tokens: int = MAX_TOKENS, parallel: int = len(PROMPTS),
) -> ServedReport:  # fmt: skip
    """Start every server (side by side, as bench does), two passes each, stop everything; the comparisons."""
    from gptoss_patch.bench.servers import RunningServer, check_ports, start_side_by_side

    check_ports(specs)
    started = time.monotonic()
    servers: list[RunningServer] = []
    passes: list[Pass] = []
    try:
        start_side_by_side(specs, log_dir, start_timeout, notify, servers)
        for index in (1, 2):
            for server in servers:
                if not server.alive():
                    raise server.failure(f"died during the check (exit code {server.child.returncode})")
                try:
                    done = one_pass(server.spec, index, prompts, max_tokens=max_tokens, parallel=parallel)
                except BenchFailed:
                    if not server.alive():
                        raise server.failure(f"died during the check (exit code {server.child.returncode})") from None
                    raise
                passes.append(done)
                notify(f"pass {index} on {server.spec.name}: {len(prompts)} prompts in {done.seconds:.1f} s")
    finally:
        for server in servers:
            server.stop()
    return ServedReport(
        servers=[
            {"name": s.spec.name, "command": list(s.spec.argv), "ready_seconds": s.ready_after, "log": str(s.log_file)}
            for s in servers
        ],
        agreements=agreements(passes), prompts=len(prompts), max_tokens=max_tokens, parallel=parallel,
        seconds=round(time.monotonic() - started, 1),
    )  # fmt: skip
