"""DAPO dynamic sampling (DAPO, Yu et al. 2025, §3.2; a baseline of the GRAFT paper): train each policy only on
groups whose rewards differ, topping the batch up with extra prompts (docs/methods.md §1, "Dynamic sampling").

With ``model.algorithm.dynamic_sampling``, per policy and step (``B`` = the step's prompts on this process,
``data.batch_size``):

1. **Round 0** is the step's own batch, sampled and scored exactly as without dynamic sampling (group ids
   ``batch.offset + i``).
2. **Filter.** A group whose rewards are all equal (all-pass or all-fail: zero variance, so every GRPO advantage
   in it is 0) is dropped. Rewards are the run's total reward (``model.reward``); DAPO's verl recipe can filter on
   accuracy instead.
3. **Extra rounds.** While fewer than ``B`` groups are kept and fewer than ``dynamic_sampling_max_rounds`` extra
   rounds have run, round ``r`` draws ``B`` more prompts (:func:`extra_prompts`), samples the policy's ``n``
   rollouts for each, scores them and keeps the mixed groups. A round draws a whole batch, as DAPO generates whole
   generation batches; the default limit, 9 extra rounds, allows 10 generation batches per step, the
   ``max_num_gen_batches`` of DAPO's published verl scripts.
4. **Keep exactly B.** The policy trains on the first ``B`` kept groups in sampling order (round 0's in batch
   order, then each round's); the surplus of the last round is cut and never trained on. When the rounds run
   out first it trains on the kept groups it has (fewer than ``B``; ``limit_hit`` = 1), or, when none was kept,
   on round 0's groups, whose advantages are all 0, so the step is the one plain GRPO would take *(ours: DAPO's
   verl recipe raises instead)*.

The groups the policy trains on are the ones published to the exchange (and stored with its traffic). On a step
where MWRA does not update the policy (``update_every``) nothing is filtered and no extra round runs.

**Extra prompts** are drawn from the data module's training problems (``PromptDataModule.train_problems()``),
never from the training stream, which therefore continues exactly as without dynamic sampling: ``B`` problems
without replacement among those whose prompt id was not sampled yet in this step (round 0 and earlier rounds),
topped up from all problems with replacement when too few remain, with
``random.Random(f"dynamic_sampling:{data.seed}:{step}:{rank}:{round}")``. So they are a pure function of the data
seed, the step, the rank, the round and the step's earlier prompts: a resumed run draws the same prompts (the
rollouts follow the checkpointed sampling stream), and the same for every policy of the step.

**Group ids** of round ``r >= 1``: ``EXTRA_GROUP_IDS + ((step * world + rank) * max_rounds + r - 1) * B + i``,
unique within the step and across ranks, and never one of the stream's ids (``batch.offset + i`` stays far
below ``EXTRA_GROUP_IDS`` = 2**50), so ``(prompt_id, group_id)`` names every group of the step.

**Sharing regimes.** After filtering every policy keeps different groups, so its peers' groups no longer answer
its own by ``(prompt_id, group_id)``; dynamic sampling is therefore only supported with a regime that reads
nothing from peers (``NoSharing``, ``model.regime: none``), checked when the module is built
(:func:`check_dynamic_sampling`).

**Metrics** (``<policy>/...``): outcome metrics (``reward``, ``pass_rate``, ``all_fail_frac``, ...,
``response_length``, ``eos_frac``) describe round 0, the step's own batch, so curves compare with the other
regimes; ``generated_tokens``, ``gen_s`` and ``gen_tokens_per_s`` cover every round, and
``reward_errors`` / ``reward_timeouts`` count over every round. ``dynamic_sampling/rounds`` (extra rounds run),
``extra_prompts``, ``extra_rollouts`` (= ``n`` x ``extra_prompts``), ``kept_groups`` (mixed groups trained on),
``dropped_groups`` (zero-variance groups of every round), ``surplus_groups`` (mixed groups cut from the last
round) and ``limit_hit``; ``kept + dropped + surplus = B x (1 + rounds)``. The MWRA accounting
(``allocation.step_usage``) reads the report's ``generated_tokens``, so its totals include the extra rollouts.
Several processes: the values are per-rank means, like every per-policy metric.

**Several processes.** Under FSDP every ``generate`` of a sharded policy is collective: before each extra round
the ranks agree (one reduction) whether any of them still needs prompts, and a rank that is already full takes
part in the others' passes with an empty ``generate`` (the engine runs lockstep dummies). A reward error on one
rank ends the rounds on every rank before it is raised (the module then stops all ranks together).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from mutual_rl.distributed import agree_max, rank_and_world
from mutual_rl.rewards import RewardError
from mutual_rl.stats import DynamicSamplingStats, RolloutStats, ScoringStats
from mutual_rl.types import Problem, PromptBatch, Rollout, ScoredGroup

EXTRA_GROUP_IDS = 2**50
"""First group id of the extra rounds' groups (the stream's ids ``batch.offset + i`` stay below it)."""

Generate = Callable[[Sequence[Problem], int], list[list[Rollout]]]  # (problems, group_id_base) -> per prompt
Score = Callable[[Sequence[Problem], list[list[Rollout]]], tuple[list[ScoredGroup], ScoringStats]]


@dataclass(frozen=True)
class Sampled:
    """One policy's scored groups of a step and how they were sampled and scored."""

    groups: list[ScoredGroup]
    rollout: RolloutStats
    scoring: ScoringStats
    dynamic_sampling: DynamicSamplingStats | None = None


def sample_round(generate: Generate, score: Score, problems: Sequence[Problem], group_id_base: int) -> Sampled:
    """One generate-and-score pass over ``problems``: the scored groups, the sampling's tokens and seconds, and the
    scoring's outcomes."""
    t0 = time.perf_counter()
    per_prompt = generate(problems, group_id_base)
    gen_s = time.perf_counter() - t0
    groups, scoring = score(problems, per_prompt)
    flat = [r for rs in per_prompt for r in rs]
    rollout = RolloutStats(
        generated_tokens=float(sum(len(r.response_ids) for r in flat)), gen_s=gen_s,
        response_length=sum(len(r.response_ids) for r in flat) / max(len(flat), 1),
        eos_frac=sum(r.finish_reason == "eos" for r in flat) / max(len(flat), 1))
    return Sampled(groups, rollout, scoring)


def has_variance(group: ScoredGroup) -> bool:
    """Whether the group's rewards are not all equal (a mixed group: some GRPO advantage is non-zero)."""
    return bool((group.rewards != group.rewards[0]).any()) if len(group.rewards) else False


def extra_prompts(pool: Sequence[Problem], k: int, *, seed: int, step: int, round: int, rank: int = 0,
                  exclude: frozenset[int] | set[int] = frozenset()) -> list[Problem]:
    """``k`` problems of ``pool`` for extra round ``round`` of ``step`` (module docstring): without replacement
    among those whose prompt id is not in ``exclude``, then with replacement from all of ``pool`` if too few."""
    rng = random.Random(f"dynamic_sampling:{seed}:{step}:{rank}:{round}")
    fresh = [p for p in pool if p.prompt_id not in exclude]
    out = rng.sample(fresh, min(k, len(fresh)))
    if len(out) < k:
        out += rng.choices(list(pool), k=k - len(out))
    return out


def extra_group_id_base(step: int, rank: int, world: int, round: int, max_rounds: int, size: int) -> int:
    """Group id of the first prompt of extra round ``round`` (1-based) of ``step`` on ``rank``."""
    return EXTRA_GROUP_IDS + ((step * world + rank) * max_rounds + round - 1) * size


def training_pool(datamodule) -> tuple[Sequence[Problem], int]:
    """The training problems extra prompts are drawn from, and the data seed."""
    problems = getattr(datamodule, "train_problems", None)
    if problems is None:
        raise ValueError("model.algorithm.dynamic_sampling draws its extra prompts from the data module's training "
                         "problems, but the trainer has no data module with train_problems() (configure data: as a "
                         "mutual_rl PromptDataModule), or set model.algorithm.dynamic_sampling: false.")
    return problems(), int(getattr(datamodule, "seed", 0))


def dynamic_sample(generate: Generate, score: Score, batch: PromptBatch, *, step: int, max_rounds: int,
                   datamodule, lockstep: bool = False) -> Sampled:
    """One policy's training groups of ``step`` under dynamic sampling, and their statistics (module docstring).

    ``generate(problems, group_id_base)`` samples the policy's rollouts (one list per problem), ``score(problems,
    per_prompt)`` scores them (:func:`mutual_rl.update.scoring.score_groups`). ``lockstep``: the policy is
    sharded over several processes, so every rank runs the same number of ``generate`` calls.
    """
    pool, seed = training_pool(datamodule)
    rank, world = rank_and_world()
    size = len(batch.problems)
    error: RewardError | None = None
    first: Sampled | None = None
    try:
        first = sample_round(generate, score, batch.problems, batch.offset)
    except RewardError as e:  # raised below, after the other ranks learnt of it
        error = e
    kept = [g for g in first.groups if has_variance(g)] if first is not None else []
    counts = dict.fromkeys(("rounds", "extra_prompts", "extra_rollouts"), 0)
    dropped = len(first.groups) - len(kept) if first is not None else 0
    tokens = gen_s = 0.0
    errors = timeouts = 0
    used = {p.prompt_id for p in batch.problems}
    for r in range(1, max_rounds + 1):
        need = error is None and len(kept) < size
        flags = [int(need), int(error is not None)]
        go, failed = agree_max(flags) if lockstep else flags
        if failed or not go:
            break
        if not need:  # another rank still samples: take part in its collective passes
            generate([], 0)
            continue
        problems = extra_prompts(pool, size, seed=seed, step=step, round=r, rank=rank, exclude=used)
        used.update(p.prompt_id for p in problems)
        try:
            extra = sample_round(generate, score, problems, extra_group_id_base(step, rank, world, r, max_rounds, size))
        except RewardError as e:
            error = e
            continue
        counts["rounds"] += 1
        counts["extra_prompts"] += len(problems)
        counts["extra_rollouts"] += sum(len(g.rollouts) for g in extra.groups)
        fresh = [g for g in extra.groups if has_variance(g)]
        dropped += len(extra.groups) - len(fresh)
        kept += fresh
        tokens += extra.rollout.generated_tokens
        gen_s += extra.rollout.gen_s
        errors += extra.scoring.reward_errors
        timeouts += extra.scoring.reward_timeouts
    if error is not None:
        raise error
    rollout = replace(first.rollout, generated_tokens=first.rollout.generated_tokens + tokens,
                      gen_s=first.rollout.gen_s + gen_s)
    scoring = replace(first.scoring, reward_errors=first.scoring.reward_errors + errors,
                      reward_timeouts=first.scoring.reward_timeouts + timeouts)
    stats = DynamicSamplingStats(**counts, kept_groups=min(len(kept), size), dropped_groups=dropped,
                                 surplus_groups=max(len(kept) - size, 0), limit_hit=int(len(kept) < size))
    return Sampled(kept[:size] if kept else first.groups, rollout, scoring, stats)


def check_dynamic_sampling(algorithm, specs: Sequence, regimes: Mapping[str, object]) -> None:
    """With ``algorithm.dynamic_sampling``: every receiver's regime reads nothing from peers, and every policy
    samples groups of two or more responses (a group of one never has mixed rewards); else one ``ValueError``."""
    if not algorithm.dynamic_sampling:
        return
    from mutual_rl.regimes import regime_name

    sharing = {name: regime_name(r) for name, r in regimes.items() if r.subscribes}
    if sharing:
        raise ValueError(
            f"model.algorithm.dynamic_sampling is on, but receivers {sorted(sharing)} have sharing regimes "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(sharing.items()))}). Dynamic sampling keeps different "
            "groups for every policy, so peers' groups no longer pair with a receiver's by (prompt_id, group_id); it "
            "is supported only without sharing. Set model.regime: none (class_path NoSharing) and no per-policy "
            "regime (as configs/dapo_ds.yaml), or set model.algorithm.dynamic_sampling: false.")
    small = [s.name for s in specs if s.sampling.n < 2]
    if small:
        raise ValueError(f"model.algorithm.dynamic_sampling keeps only groups whose rewards differ, which a group of "
                         f"one response never has: policies {small} have sampling.n < 2; give them sampling.n >= 2.")
