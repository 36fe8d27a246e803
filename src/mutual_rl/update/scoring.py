"""Score a policy's rollouts on text and compute GRPO advantages per own group (explicit group ids)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.algorithms import group_outcome_stats, grpo_advantages
from mutual_rl.rewards.combined import Reward, as_reward
from mutual_rl.stats import ScoringStats
from mutual_rl.types import Problem, Rollout, ScoredGroup


def score_groups(
    policy_id: str, problems: Sequence[Problem], per_prompt: Sequence[Sequence[Rollout]],
    reward_fn, *, eps: float = 1e-6, scale: str = "group", success_threshold: float = 0.0,
) -> tuple[list[ScoredGroup], ScoringStats]:
    """One ScoredGroup per problem (rewards on the response text) and the group outcomes.

    ``reward_fn``: the run's :class:`~mutual_rl.rewards.combined.Reward` (``model.reward``: one function or a
    weighted list of terms), a guard, or a plain function (text-style ``fn(completion, answer)`` or TRL-style
    ``f(prompts, completions, **columns)``, detected by signature), which gets a guard with the defaults: 5 s per
    completion, errors raise. Each group's reward is the weighted sum of the terms
    (:mod:`mutual_rl.rewards.combined`). The stats count this call's completions scored 0.0 after a skipped
    failure (``reward_errors``, ``reward_timeouts``); a reward given as a list of terms adds ``reward_terms``, each
    term's unweighted mean over all rollouts of the call.
    """
    reward: Reward = as_reward(reward_fn)
    counts = {"error": 0, "timeout": 0}
    term_sums = dict.fromkeys(reward.names, 0.0)
    rewards = []
    for p, rs in zip(problems, per_prompt):
        where = f"policy {policy_id!r}, prompt {p.prompt_id}"
        scored = reward.score_group(p, [r.response_text for r in rs], where=where)
        rewards.append(torch.tensor(scored.total, dtype=torch.float32))
        counts["error"] += scored.errors
        counts["timeout"] += scored.timeouts
        for name, values in scored.terms.items():
            term_sums[name] += sum(values)
    flat_r = torch.cat(rewards)
    flat_g = torch.cat([torch.full((len(rs),), rs[0].group_id, dtype=torch.long) for rs in per_prompt])
    adv = grpo_advantages(flat_r, flat_g, eps=eps, scale=scale)
    groups, start = [], 0
    for p, rs, r in zip(problems, per_prompt, rewards):
        groups.append(ScoredGroup(policy_id, p.prompt_id, rs[0].group_id, tuple(rs), r, adv[start : start + len(r)]))
        start += len(r)
    stats = group_outcome_stats(flat_r, flat_g, success_threshold)
    num = sum(len(rs) for rs in per_prompt)
    return groups, ScoringStats(
        reward=stats["reward_mean"], pass_rate=stats["pass_rate"], all_fail_frac=stats["all_fail_frac"],
        all_pass_frac=stats["all_pass_frac"], mixed_frac=stats["mixed_frac"], reward_errors=counts["error"],
        reward_timeouts=counts["timeout"],
        reward_terms={name: total / num for name, total in term_sums.items()} if reward.log_terms else {},
    )
