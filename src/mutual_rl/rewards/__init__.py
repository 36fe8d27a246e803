"""Text-in rewards (docs/design.md, rule 12): ``fn(completion: str, answer: str) -> float``, one registry.

Registered names: ``integer_match`` (strict integer exact match, the built-in task's reward),
``boxed_integer_match``, ``last_integer`` (lenient), ``boxed_format``, ``math_verify`` (math-verify in a
worker process with a hard time limit). Resolve a name once with :func:`get_reward`; a run calls it through
:class:`GuardedReward` (a time limit per call, results checked; :mod:`mutual_rl.rewards.guard`). Your own
``package.module:function`` rewards run in a worker process of their own (:class:`IsolatedReward`,
:mod:`mutual_rl.rewards.isolation`; ``model.reward_isolation``).

TRL-style functions ``f(prompts, completions, **columns) -> list[float | None]`` are called once per group through
:class:`GuardedBatchReward` (:mod:`mutual_rl.rewards.trl_style`); ``model.reward`` may be a weighted list of
:class:`RewardTerm` mixing both styles, built into one :class:`Reward` by :func:`build_reward`
(:mod:`mutual_rl.rewards.combined`).
"""

from mutual_rl.rewards.base import (
    RewardFn,
    RewardResult,
    available_rewards,
    get_reward,
    register_reward,
    score,
)
from mutual_rl.rewards.combined import GroupScore, Reward, RewardTerm, as_reward, build_reward
from mutual_rl.rewards.guard import GuardedReward, RewardError, check_reward_settings
from mutual_rl.rewards.integer import (
    boxed_format,
    boxed_integer_match,
    integer_match,
    integer_match_with_info,
    last_integer,
)
from mutual_rl.rewards.isolation import IsolatedReward, close_workers
from mutual_rl.rewards.trl_style import GuardedBatchReward, reward_style
from mutual_rl.rewards.verify import MathVerifier, math_verify, math_verify_with_info

__all__ = [
    "GroupScore",
    "GuardedBatchReward",
    "GuardedReward",
    "IsolatedReward",
    "MathVerifier",
    "Reward",
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardTerm",
    "as_reward",
    "available_rewards",
    "boxed_format",
    "boxed_integer_match",
    "build_reward",
    "check_reward_settings",
    "close_workers",
    "get_reward",
    "integer_match",
    "integer_match_with_info",
    "last_integer",
    "math_verify",
    "math_verify_with_info",
    "register_reward",
    "reward_style",
    "score",
]
