"""`gptoss-patch smoke URL`: the smoke canary against a running OpenAI-compatible server."""

from __future__ import annotations

from typing import Annotated

from gptoss_patch import clikit
from gptoss_patch.errors import ExitCode, UsageError
from gptoss_patch.options import JsonOption, VerboseOption, handles_errors

ModelOption = Annotated[
    str | None, clikit.Option("--model", metavar="NAME", help="Model name to send (default: the first of /v1/models).", show_default=False)
]
ApiKeyOption = Annotated[
    str | None,
    clikit.Option("--api-key", envvar="VLLM_API_KEY", metavar="KEY", help="Bearer key; default: $VLLM_API_KEY.",
                  show_default=False, show_envvar=False),
]
TimeoutOption = Annotated[float, clikit.Option("--timeout", metavar="SECONDS", help="Give up on the request after this long.")]


def register(app: clikit.App) -> None:
    app.command("smoke", no_args_is_help=True)(smoke)


@handles_errors
def smoke(
    url: Annotated[str, clikit.Argument(help="Server base URL, e.g. http://127.0.0.1:8000", show_default=False)],
    model: ModelOption = None,
    api_key: ApiKeyOption = None,
    timeout: TimeoutOption = 300.0,
    json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Send one gpt-oss chat completion (temperature 0) to the server at URL and check the answer.

    Checks: HTTP 200, content non-null, finish_reason stop, no repetition loop, system prompt obeyed;
    reports output tokens per second. Exit 1 when any check fails.
    """
    from gptoss_patch import render
    from gptoss_patch.launcher import smoke as canary

    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{url!r} is not an http(s) URL; give the server's base URL, e.g. http://127.0.0.1:8000")
    report = canary.run_smoke(url, model=model, api_key=api_key, timeout=timeout)
    if json:
        render.json_out(report.to_json())
    else:
        render.info(f"Smoke canary: {report.url} (model {report.model})")
        render.checks_table(report.checks)
    if not report.ok:
        raise clikit.Exit(int(ExitCode.ACTION_NEEDED))
