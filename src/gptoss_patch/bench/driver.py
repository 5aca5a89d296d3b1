"""Run `vllm bench serve` several times in one process (run in the target interpreter by gptoss_patch.bench).

Reads one JSON object on stdin, {"runs": [{"id": "...", "argv": [...]}, ...]}: each argv is what
`vllm bench serve` would be given. vLLM's own benchmark code parses and runs it (the module behind the
`vllm bench serve` subcommand), so the numbers are vLLM's; one process for all the runs spares each run
the seconds of importing vLLM and loading the tokenizer. Prints one JSON line per run on stdout:
{"id", "result": {scalar metrics}} or {"id", "error": "..."}; a first line {"fatal": "..."} when the
benchmark code cannot be imported. vLLM's own narration goes to stderr. Standard library plus vLLM only.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any


def parser() -> Any:  # vLLM's FlexibleArgumentParser (or argparse's)
    from vllm.benchmarks.serve import add_cli_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:
        try:
            from vllm.utils import FlexibleArgumentParser as Parser
        except ImportError:
            from argparse import ArgumentParser as Parser
    made = Parser(prog="vllm bench serve")
    add_cli_args(made)
    return made


def emit(payload: dict) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def scalars(result: dict) -> dict:
    """The summary numbers only: the per-request lists (ttfts, itls, ...) stay behind."""
    return {key: value for key, value in result.items() if isinstance(value, (int, float, str, bool)) or value is None}


def main() -> int:
    payload = json.loads(sys.stdin.readline())
    try:
        from vllm.benchmarks.serve import main as bench_main

        made = parser()
    except Exception as exc:  # noqa: BLE001 - any import failure means there is no `vllm bench serve` here
        emit({"fatal": f"vllm bench serve is not available in {sys.executable}: {type(exc).__name__}: {exc}"})
        return 3
    for run in payload["runs"]:
        try:
            args = made.parse_args(run["argv"])
            with contextlib.redirect_stdout(sys.stderr):
                result = bench_main(args)
        except SystemExit as exc:
            emit({"id": run["id"], "error": f"vllm bench serve exited ({exc.code})"})
            return 4
        except Exception as exc:  # noqa: BLE001 - reported to the engine, which knows whether a server died
            emit({"id": run["id"], "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
            return 4
        emit({"id": run["id"], "result": scalars(result or {})})
    return 0


if __name__ == "__main__":
    sys.exit(main())
