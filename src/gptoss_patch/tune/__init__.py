"""`gptoss-patch tune`: measure serving configurations on the user's own GPUs and vLLM, keep only what passes the
numerics gate, and leave the winner in a profile file that `serve` and `doctor` use.

Each candidate is the reference configuration (the built-in profile, as `serve` starts it) with one change; every
server is launched through the one launch path (launcher/prepare.py), measured one at a time with bench's method,
and gated with numerics' checks.

    candidates.py  what this vLLM offers on this GPU, per axis (MoE kernels, attention backends, capture sizes,
                   --max-num-batched-tokens, async scheduling, TP against DP), and what is left out with why
                   (the known-issue catalogue's rows, flags this vLLM lacks, what the user fixed after --)
    planner.py     the time budget: estimates, the candidates that fit, "needs at least X", the refit once the
                   reference has run
    runner.py      one server at a time through bench.run: the served check's passes, then the load; crashes as
                   results; the partial file after each server; progress with elapsed time and an estimate
    gate.py        the kernel check's and the served check's verdicts per candidate, and the choice of the winner
    profile.py     the profile file (per GPU, vLLM and model shape, in the cache root's `tune` entry, written
                   atomically), the partial file, the lock per GPU, and the lookup serve and doctor make
    render.py      the table `tune` and `tune --show` print

Engine only: results come back as data; commands/tune.py and tune/render.py print.
"""

from gptoss_patch.tune.candidates import AXES, Candidate, Skipped, parse_axes, select, user_candidates
from gptoss_patch.tune.gate import SERVED_LIMIT, Verdict, choose, kernel_verdicts, served_verdict
from gptoss_patch.tune.planner import CPU_COSTS, GPU_COSTS, Costs, TunePlan, duration, fit, parse_budget, refit
from gptoss_patch.tune.profile import Key, ProfileCorrupt, key_of, lookup
from gptoss_patch.tune.runner import Job, Outcome, run

__all__ = [
    "AXES", "CPU_COSTS", "GPU_COSTS", "SERVED_LIMIT", "Candidate", "Costs", "Job", "Key", "Outcome", "ProfileCorrupt",
    "Skipped", "TunePlan", "Verdict", "choose", "duration", "fit", "kernel_verdicts", "key_of", "lookup", "parse_axes",
    "parse_budget", "refit", "run", "select", "served_verdict", "user_candidates",
]  # fmt: skip
