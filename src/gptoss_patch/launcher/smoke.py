"""The smoke canary: where the system prompt landed, then one chat completion whose answer can be checked mechanically.

The rendering check needs no good model: it sends a system message and then a developer message, each
carrying its own unique marker, with `return_token_ids`, decodes the prompt the server built (its
/detokenize) and says where each marker landed: in the harmony instructions, as a raw second system
message (G02, harmony_instructions), or nowhere (a developer message after a system message is rendered
empty when the server puts instructions in the system message: VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1).
It also reads the model's confidence in its first token: a trained gpt-oss is near certain of it,
random or untrained weights spread it over the whole vocabulary.

The content checks catch what no static check can: `content: null` (G08, G14), a kernel that loops or
emits garbage (G14), and a system prompt the model ignored (G02). With weights that cannot pass them,
they say so instead of blaming a patch. Stdlib only (urllib, through launcher/http.py: never a proxy for
loopback), like the rest of the tool.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

from gptoss_patch.launcher.http import opener_for
from gptoss_patch.launcher.results import Check, SmokeReport, Status

MARKER = "PAPAYA-7"
SYSTEM_PROMPT = f"You are a terse assistant. End every reply with the code word {MARKER}."
USER_PROMPT = "What is the capital of France? Answer in one short sentence."
MAX_TOKENS = 512  # room for the analysis channel before the final answer (canary, known-issues doc)
RENDER_MARKER = "CANARY-"  # + random hex: unique per run, so it cannot come from a cached prompt
START, MESSAGE, END = "<|start|>", "<|message|>", "<|end|>"
# The first token's log-probability above which weights look trained. A trained gpt-oss is near certain
# of `<|channel|>` (about 0); uniform over gpt-oss's 201,088 tokens is ln(1/201088), about -12.2.
TRAINED_LOGPROB = -5.0


def run_smoke(base_url: str, *, model: str | None = None, api_key: str | None = None, timeout: float = 300.0) -> SmokeReport:
    base_url = base_url.rstrip("/")
    try:
        model = model or first_model(base_url, api_key, timeout)
    except _Unreachable as exc:
        return SmokeReport(base_url, model or "?", (Check("http", Status.FAIL, str(exc), fix="is the server up? check the URL"),))
    rendering, confidence = check_rendering(base_url, model, api_key, timeout)
    body = _request_body(model)
    warnings = stop_string_checks(body)  # none for smoke's own body: kept beside the request it judges
    started = time.perf_counter()
    status, payload, error = _post_json(base_url + "/v1/chat/completions", body, api_key, timeout)
    elapsed = time.perf_counter() - started
    if status != 200:
        detail = error or f"HTTP {status}"
        return SmokeReport(base_url, model, (rendering, Check("http", Status.FAIL, detail, fix="read the server log for the request's error")))
    report = evaluate(base_url, model, payload, elapsed)
    checks = (rendering, *warnings, *report.checks)
    if confidence is not None and confidence < TRAINED_LOGPROB:
        checks = (rendering, *warnings, *_not_judged(report.checks, confidence))
    return SmokeReport(base_url, model, checks, content=report.content, tokens_per_second=report.tokens_per_second)


# -- rendering -----------------------------------------------------------------------------------


def check_rendering(base_url: str, model: str, api_key: str | None, timeout: float) -> tuple[Check, float | None]:
    """(where the marked system and developer messages landed, the model's log-probability of its first token or None)."""
    token = secrets.token_hex(4)
    marker, developer_marker = f"{RENDER_MARKER}S{token}", f"{RENDER_MARKER}D{token}"  # neither contains the other
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": f"Carry the code {marker}."},
            {"role": "developer", "content": f"Also carry the code {developer_marker}."},
            {"role": "user", "content": "hi"},
        ],
        "max_tokens": 1, "temperature": 0, "return_token_ids": True, "logprobs": True, "top_logprobs": 1,
    }
    status, payload, error = _post_json(base_url + "/v1/chat/completions", body, api_key, timeout)
    ids = (payload or {}).get("prompt_token_ids")
    if status != 200 or not isinstance(ids, list):
        why = error or (f"HTTP {status}" if status != 200 else "the answer has no prompt_token_ids (this vLLM cannot return them)")
        return Check("rendering", Status.WARN, f"cannot read the rendered prompt: {why}"), None
    status, decoded, error = _post_json(base_url + "/detokenize", {"model": model, "tokens": ids}, api_key, timeout)
    text = (decoded or {}).get("prompt")
    if status != 200 or not isinstance(text, str):
        return Check("rendering", Status.WARN, f"cannot decode the rendered prompt: {error or f'HTTP {status}'}"), None
    verdict = rendering_verdict(locate_marker(text, marker), locate_marker(text, developer_marker), len(ids))
    return verdict, first_token_logprob(payload)


def locate_marker(prompt: str, marker: str) -> str:
    """Where `marker` sits in a decoded harmony prompt: system-instructions, developer-instructions,
    second-system-message, another role's message, or missing."""
    system_seen = False
    for segment in prompt.split(START)[1:]:
        header, _, rest = segment.partition(MESSAGE)
        role = header.split("<|")[0].strip()
        body = rest.split(END)[0]
        first_system = role == "system" and not system_seen
        system_seen = system_seen or role == "system"
        if marker not in body:
            continue
        if role == "system":
            return "system-instructions" if first_system else "second-system-message"
        if role == "developer" and "# Instructions" in body:
            return "developer-instructions"
        return f"{role or 'unknown'}-message"
    return "missing"


INSTRUCTION_PLACES = {
    "system-instructions": "the system message's instructions",
    "developer-instructions": "the developer message's instructions",
}
SYSTEM_PLACEMENT_FIX = ("restart with VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS unset (gptoss-patch serve "
                        "--instructions developer, the default): both messages are kept")


def rendering_verdict(where: str, developer_at: str, tokens: int) -> Check:
    """The verdict on one rendered prompt: `where` the client's system message landed, `developer_at` where the
    developer message that followed it did (locate_marker's answers)."""
    if where in INSTRUCTION_PLACES and developer_at in INSTRUCTION_PLACES:
        message = (f"both in the harmony instructions: the client's system message in {INSTRUCTION_PLACES[where]}, "
                   f"its developer message in {INSTRUCTION_PLACES[developer_at]} ({tokens} prompt tokens)")
        return Check("rendering", Status.PASS, message)
    if where in INSTRUCTION_PLACES:
        return _developer_lost(where, developer_at)
    if where == "second-system-message":
        message = "the client's system message is rendered as a raw second harmony system message"
        return Check("rendering", Status.FAIL, message, fix="gptoss-patch apply --only harmony_instructions (G02)", issue="G02")
    message = f"the client's system message is not where harmony puts instructions (found: {where})"
    return Check("rendering", Status.FAIL, message, fix="gptoss-patch status: harmony_instructions must be applied (G02)", issue="G02")


def _developer_lost(where: str, developer_at: str) -> Check:
    """The system message is in the instructions, the developer message after it is not."""
    if developer_at == "missing" and where == "system-instructions":
        message = ("the client's developer message is missing from the rendered prompt: the server puts instructions in "
                   "the system message (VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1, `gptoss-patch serve --instructions "
                   "system`), which renders a developer message after a system message empty: its text is lost")
        return Check("rendering", Status.FAIL, message, fix=SYSTEM_PLACEMENT_FIX, issue="G02")
    found = "missing from the rendered prompt" if developer_at == "missing" else f"not where harmony puts instructions (found: {developer_at})"
    message = f"the client's system message is in {INSTRUCTION_PLACES[where]}, but its developer message is {found}"
    return Check("rendering", Status.FAIL, message, fix="gptoss-patch status: harmony_instructions must be applied (G02)", issue="G02")


def first_token_logprob(payload: dict[str, Any]) -> float | None:
    choice = (payload.get("choices") or [{}])[0]
    content = ((choice.get("logprobs") or {}).get("content") or [])
    value = content[0].get("logprob") if content and isinstance(content[0], dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _not_judged(checks: tuple[Check, ...], logprob: float) -> list[Check]:
    """Content checks say nothing about patches when the weights are random: report them as such."""
    why = (f"not judged: the model's first token had log-probability {logprob:.1f} (a trained gpt-oss is near 0, "
           f"uniform over the vocabulary is {math.log(1 / 201088):.1f}): random or untrained weights, not a patch problem")
    out = []
    for check in checks:
        if check.status is Status.FAIL and check.name in ("content", "finish_reason", "repetition", "instruction"):
            check = Check(check.name, Status.WARN, f"{check.message}; {why}")
        out.append(check)
    return out


def _request_body(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER_PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }


# G49: vLLM matches a request's `stop` strings against the whole output, the analysis channel included (vllm#52599,
# open): a stop string the model thinks before it answers ends the request with no final answer, finish_reason "stop".
STOP_IN_REASONING = (
    "`stop` strings also match inside gpt-oss's reasoning (the analysis channel): when one appears there the request "
    "ends with no final answer and finish_reason \"stop\" (vllm#52599, open)"
)


def stop_string_checks(body: dict[str, Any]) -> tuple[Check, ...]:
    """A warning for a gpt-oss request that sets `stop` (a string or a non-empty list); none otherwise."""
    stop = body.get("stop")
    if not stop:
        return ()
    named = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    message = f"the request sets stop {json.dumps(named)}: {STOP_IN_REASONING}"
    fix = "drop `stop` and cut the final answer at the string on the client"
    return (Check("stop", Status.WARN, message, fix=fix, issue="G49"),)


def evaluate(url: str, model: str, payload: dict[str, Any], elapsed: float) -> SmokeReport:
    choice = (payload.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = message.get("content")
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    rate, usage_check = _throughput(payload, elapsed)
    checks = (
        Check("http", Status.PASS, f"HTTP 200 in {elapsed:.1f} s"),
        _content_check(content, reasoning),
        _finish_reason_check(choice.get("finish_reason"), content),
        _repetition_check(f"{content or ''}\n{reasoning}"),
        _instruction_check(content),
        usage_check,
    )
    return SmokeReport(url, model, checks, content=content, tokens_per_second=rate)


def _content_check(content: str | None, reasoning: str) -> Check:
    if content and content.strip():
        return Check("content", Status.PASS, f"{len(content)} characters")
    where = f"; {len(reasoning)} characters landed in `reasoning`" if reasoning else ""
    state = "null" if content is None else "empty"
    return Check("content", Status.FAIL, f"content is {state}{where}", fix="see G08 (parser, max_tokens) and, on GB10, G14", issue="G08")


def _finish_reason_check(reason: str | None, content: str | None) -> Check:
    if reason == "stop":
        return Check("finish_reason", Status.PASS, "stop")
    hint = " inside the analysis channel" if reason == "length" and not content else ""
    message = f"finish_reason is {reason!r}, not 'stop'" + (f": max_tokens ({MAX_TOKENS}) ran out{hint}" if reason == "length" else "")
    return Check("finish_reason", Status.FAIL, message, fix="a looping or garbled model never stops; see G14", issue="G08")


def _repetition_check(text: str) -> Check:
    found = find_repetition(text)
    if found is None:
        return Check("repetition", Status.PASS, "no repeated n-gram loop")
    unit, count = found
    message = f"degenerate repetition: {unit[:40]!r} x{count}"
    return Check("repetition", Status.FAIL, message, fix="the MoE kernel is suspect: check the backend line in the startup log (G14)", issue="G14")


def _instruction_check(content: str | None) -> Check:
    if content and MARKER.lower() in content.lower():
        return Check("instruction", Status.PASS, f"system prompt obeyed (the reply carries {MARKER})")
    message = f"the reply ignores the system prompt (no {MARKER})"
    return Check("instruction", Status.FAIL, message, fix="gptoss-patch status: harmony_instructions must be applied (G02)", issue="G02")


def _throughput(payload: dict[str, Any], elapsed: float) -> tuple[float | None, Check]:
    tokens = (payload.get("usage") or {}).get("completion_tokens")
    if not isinstance(tokens, int) or elapsed <= 0:
        return None, Check("throughput", Status.WARN, "no usage.completion_tokens in the response")
    rate = tokens / elapsed
    return rate, Check("throughput", Status.PASS, f"{tokens} output tokens in {elapsed:.2f} s: {rate:.1f} tok/s (end to end)")


# -- repetition ----------------------------------------------------------------------------------

_CHAR_LOOP = re.compile(r"(\S.{0,31}?)\1{9,}", re.S)  # one unit back to back 10+ times: "!!!!!!!!!!", "abcabc..."


def find_repetition(text: str, *, n: int = 4, min_repeats: int = 4, min_coverage: float = 0.3) -> tuple[str, int] | None:
    """A looping unit and its count, or None.

    Two signatures of a degenerate decode: a short unit repeated back to back (garbage like `!!!!`), and a
    word n-gram that recurs often enough to cover a large share of the text ("The user is asking about...").
    """
    match = _CHAR_LOOP.search(text)
    if match:
        return match[1], len(match[0]) // len(match[1])
    words = text.split()
    grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return None
    gram, count = grams.most_common(1)[0]
    if count >= min_repeats and count * n >= min_coverage * len(words):
        return " ".join(gram), count
    return None


# -- HTTP ----------------------------------------------------------------------------------------


class _Unreachable(Exception):
    pass


def first_model(base_url: str, api_key: str | None, timeout: float) -> str:
    status, payload, error = _request("GET", base_url + "/v1/models", None, api_key, timeout)
    models = [m.get("id") for m in (payload or {}).get("data", []) if isinstance(m, dict)]
    if status != 200 or not models:
        raise _Unreachable(error or f"GET /v1/models answered HTTP {status} with no model")
    return str(models[0])


def _post_json(url: str, body: dict[str, Any], api_key: str | None, timeout: float) -> tuple[int, Any, str | None]:
    return _request("POST", url, body, api_key, timeout)


def _request(
    method: str, url: str, body: dict[str, Any] | None, api_key: str | None, timeout: float
) -> tuple[int, Any, str | None]:
    """(status, JSON payload or None, error text or None); never raises for HTTP or connection errors."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with opener_for(url).open(request, timeout=timeout) as response:
            return response.status, _json(response.read()), None
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace").strip().splitlines()
        return exc.code, None, f"HTTP {exc.code}: {text[0][:200] if text else exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if method == "GET":
            raise _Unreachable(f"cannot reach {url}: {reason}") from None
        return 0, None, f"cannot reach {url}: {reason}"


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
