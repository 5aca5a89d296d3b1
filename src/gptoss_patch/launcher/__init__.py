"""`gptoss-patch serve` / `doctor` / `smoke`: resolve a vLLM launch, check it before it starts, watch it run.

Nothing here imports vllm: the installed vLLM is read statically (static.py) or run as a child process.
Functions return results; commands/serve.py, doctor.py and smoke.py print them.
"""

# The GPU profiles `--gpu` accepts (profiles.py holds what each sets); here so the CLI need not import them.
PROFILES = ("sm90", "sm100", "sm120", "sm121", "cpu")
