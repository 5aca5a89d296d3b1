"""Build the gpt-oss prompts of a table of chat requests through the installed builder (for tests and benchmarks).

stdin: {"cases": {name: ChatCompletionRequest fields}, "settings": ["unset", "1"], "repeat": 0, "api": "chat"}
("api": "responses" renders ResponsesRequest fields through the Responses builder instead.)
stdout, behind MARKER: {"vllm", "where", "results": {setting: {name: {"ids", "text"} or {"error"}}},
"seconds": {setting: {name: median seconds per request}}} (seconds only when repeat > 0).
Each setting is a value of VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS ("unset" removes it).
"""

import json
import statistics
import sys
import time

from _builder import Builder, ResponsesBuilder
from _common import EnvVar, emit, exception_line, vllm_version

FLAG = "VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS"


def main():
    table = json.load(sys.stdin)
    builder = ResponsesBuilder() if table.get("api") == "responses" else Builder()
    results, seconds = {}, {}
    for setting in table.get("settings", ["unset", "1"]):
        with EnvVar(FLAG, None if setting == "unset" else setting):
            results[setting] = {name: render(builder, case) for name, case in table["cases"].items()}
            if table.get("repeat"):
                seconds[setting] = {name: timed(builder, case, table["repeat"]) for name, case in table["cases"].items()}
    emit({"vllm": vllm_version(), "where": builder.where, "results": results, "seconds": seconds})


def render(builder, case):
    try:
        ids = builder.build(builder.request(case))
    except Exception as exc:  # reported per case, so one bad request does not hide the others
        return {"error": exception_line(exc)}
    return {"ids": ids, "text": builder.decode(ids)}


def timed(builder, case, repeat):
    """Median seconds of request construction plus the builder call (what a server pays per request)."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        builder.build(builder.request(case))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


if __name__ == "__main__":
    main()
