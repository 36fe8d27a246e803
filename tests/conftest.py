"""Shared fixtures: a session-wide preset cache and tiny policy specs that build in seconds."""

from __future__ import annotations

import os

import pytest
import torch

from mutual_rl.rewards import register_reward
from mutual_rl.rewards.base import available_rewards

torch.set_num_threads(1)
# presets build in this process (not in the pinned worker: ~8 s of start-up per build); tests/presets/test_presets.py
# tests the worker itself
os.environ["MUTUAL_RL_PRESET_BUILD"] = "inprocess"
# and without their quality report (minutes on tiny:qwen-vocab's 151k vocabulary); tests/presets/test_presets.py turns it on
os.environ["MUTUAL_RL_PRESET_REPORT"] = "0"

if "test_parity" not in available_rewards():

    @register_reward("test_parity")
    def _parity(completion: str, answer: str) -> float:
        """Test-only reward with signal from the first step: 1 iff the response has an even length."""
        return float(len(completion) % 2 == 0)


@pytest.fixture(scope="session", autouse=True)
def preset_cache(tmp_path_factory):
    """All tests share one preset cache (each tiny preset is built once per session)."""
    path = tmp_path_factory.mktemp("preset_cache")
    old = os.environ.get("MUTUAL_RL_CACHE")
    os.environ["MUTUAL_RL_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MUTUAL_RL_CACHE", None)
    else:
        os.environ["MUTUAL_RL_CACHE"] = old
