"""How a training step is set up: the one builder of ``mutual-rl fit`` and of the Python API.

:class:`mutual_rl.module.MutualRLModule` (the host of ``mutual-rl fit``) and
:meth:`mutual_rl.step.pipeline.StepContext.from_policies` (the host of a script) both set a step up with these
functions and nothing else, so the two cannot set it up differently:

- :func:`receiver_regimes` -- every receiver its own copy of its regime (the policy's own ``regime``, else the
  shared one) with ``algorithm.success_threshold``; dynamic sampling checked against them;
- :func:`subscribe_receivers` -- each receiver subscribed on the exchange to the sources its regime reads;
- :func:`build_optimizers` -- one AdamW per policy with its ``optimizer`` settings;
- :func:`decay_ends` -- the step each policy's learning-rate decay ends (:mod:`mutual_rl.update.schedule`);
- :func:`prepare_policies` -- what the step needs of the built policies (no shared prompt forward where a
  forward may not be shared).

What stays with a host: building the policies and the reward, its rollout engine, and how a backward pass and an
optimizer step run (Lightning's manual backward and the strategy's step under ``mutual-rl fit``). The sampling
streams are the process's (:mod:`mutual_rl.rng`): the step seeds nothing, it draws from them where they are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch

from mutual_rl.data.prompt_length import check_prompt_overflow_mode
from mutual_rl.distributed import lockstep_needed
from mutual_rl.interfaces import Regime
from mutual_rl.model.spec import PolicySpec
from mutual_rl.regimes import as_regime, regime_name
from mutual_rl.rewards.guard import check_reward_settings
from mutual_rl.rewards.isolation import check_isolation
from mutual_rl.step.dynamic import check_dynamic_sampling
from mutual_rl.strategies import has_activation_checkpointing
from mutual_rl.threads import check_num_threads
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.schedule import decay_end


def receiver_regimes(specs: Sequence[PolicySpec], regime: Regime | str, algorithm: GRPOConfig) -> dict[str, Regime]:
    """Each receiver's regime, by policy name: a copy of the policy's own ``regime`` if it sets one, else of the
    shared ``regime`` (a :class:`Regime` or a registered name) -- a copy each, since regimes may keep state -- with
    ``algorithm.success_threshold`` (its one source). Dynamic sampling is checked against them
    (:func:`~mutual_rl.step.dynamic.check_dynamic_sampling`: only without sharing)."""
    shared = as_regime(regime)
    regimes = {s.name: copy.deepcopy(as_regime(s.regime) if s.regime is not None else shared) for s in specs}
    for r in regimes.values():
        r.success_threshold = algorithm.success_threshold
    check_dynamic_sampling(algorithm, specs, regimes)
    return regimes


def subscribe_receivers(exchange, specs: Sequence[PolicySpec], regimes: Mapping[str, Regime]) -> None:
    """Subscribe every receiver, in ``specs`` order, to the sources its regime reads (``regime.subscribes``) on
    ``exchange`` (:class:`mutual_rl.exchange.ExperienceExchange`), under its regime's name."""
    for spec in specs:
        r = regimes[spec.name]
        exchange.subscribe(spec.name, set(r.subscribes), regime=regime_name(r))


def build_optimizers(specs: Sequence[PolicySpec], policies: Mapping[str, torch.nn.Module]
                     ) -> dict[str, torch.optim.AdamW]:
    """One AdamW per policy, by name in ``specs`` order, over its trainable parameters with its ``optimizer``
    settings (``lr``, ``betas``, ``weight_decay``, ``eps``). The learning rate is scheduled by the step itself
    (:func:`mutual_rl.update.schedule.set_lr`, from :func:`decay_ends`): no torch scheduler."""
    out = {}
    for spec in specs:
        o = spec.optimizer
        params = [p for p in policies[spec.name].parameters() if p.requires_grad]
        out[spec.name] = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, eps=o.eps)
    return out


def decay_ends(specs: Sequence[PolicySpec], max_steps: int | None) -> dict[str, int | None]:
    """The step each policy's learning-rate decay ends, by name: its ``optimizer.decay_steps``, else ``max_steps``
    (``trainer.max_steps`` under ``mutual-rl fit``) for a cosine or linear schedule, None for a constant one; an
    error naming the policy when a decaying schedule has neither (:func:`mutual_rl.update.schedule.decay_end`)."""
    return {s.name: decay_end(s.optimizer, max_steps, s.name) for s in specs}


def prepare_policies(policies: Mapping[str, torch.nn.Module]) -> None:
    """Turn off the shared prompt forward (``policy.share_prompts``) of a policy sharded over several ranks (one
    forward per ``response_logp`` call, always: lockstep) or with activation checkpointing (the shared prompt's
    key/value cache would be appended to again when recomputed)."""
    for policy in policies.values():
        if lockstep_needed(policy.model) or has_activation_checkpointing(policy.model):
            policy.share_prompts = False


def check_host_settings(*, reward_timeout_s: float, reward_errors: str, reward_isolation: str, prompt_overflow: str,
                        thl_residual_every_n_steps: int, export_every_n_steps: int, num_threads: int | None) -> None:
    """The module's own settings (``model.*`` outside the policies, the regime and the algorithm), each refused with
    one error naming it and its range."""
    check_reward_settings(reward_timeout_s, reward_errors)
    check_isolation(reward_isolation)
    check_prompt_overflow_mode(prompt_overflow)
    if export_every_n_steps < 0:
        raise ValueError(f"model.export_every_n_steps must be >= 0 (0 = only at the end of fit), got "
                         f"{export_every_n_steps}.")
    if thl_residual_every_n_steps < 0:
        raise ValueError(f"model.thl_residual_every_n_steps must be >= 0 (0 = never), got "
                         f"{thl_residual_every_n_steps}.")
    check_num_threads(num_threads)
