"""launcher/reproducibility.py on real plans: the sm90 profile's Marlin pin (0.33.0's static files) warns in the
`reproducibility` row, --deterministic swaps it for Triton, and the SM12x pin refuses it."""

from __future__ import annotations

import pytest

from gptoss_patch.errors import UsageError
from gptoss_patch.launcher import reproducibility
from gptoss_patch.launcher.results import Status
from tests.launcher.conftest import resolve


def test_the_sm90_profile_warns_and_deterministic_gives_triton(installs) -> None:
    plan = resolve(installs["0.33.0"], model="openai/gpt-oss-120b", gpu="sm90")
    (check,) = reproducibility.checks(plan)
    assert check.status is Status.WARN and "the sm90 profile's Marlin MoE kernel gives up run-to-run" in check.message
    done = reproducibility.make_deterministic(plan)
    assert done.argv.count("--moe-backend") == 1 and done.argv[done.argv.index("--moe-backend") + 1] == "triton"
    assert reproducibility.checks(done, deterministic=True)[0].status is Status.PASS


def test_sm121_refuses_deterministic(installs) -> None:
    plan = resolve(installs["0.33.0"], model="openai/gpt-oss-120b", gpu="sm121")
    assert reproducibility.checks(plan)[0].status is Status.WARN
    with pytest.raises(UsageError, match="no MXFP4 MoE kernel but Marlin"):
        reproducibility.make_deterministic(plan)
