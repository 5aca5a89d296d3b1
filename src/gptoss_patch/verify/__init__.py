"""`verify --behaviour`: exercise the patched code paths in the target interpreter.

    behaviour.py  runs the probes in one subprocess of the target interpreter and collects ProbeResults
    probes/       the scripts that run there (stdlib only at module level; gptoss-patch never imports vllm):
                  run.py (the runner), probe_<id>.py (one per patch, found by its id),
                  prompts.py (builds gpt-oss prompts through the installed vLLM, for the tests and bench)

`gptoss-patch verify` without --behaviour (compile and re-check the patched shapes) is engine/verify.py.
"""
