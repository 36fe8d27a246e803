"""One training step of N policies, top to bottom, with no Lightning in it.

:func:`run_step` runs the phases in order and returns a typed :class:`~mutual_rl.step.report.StepReport`:

1. :func:`sample_policy` -- per policy: its rollouts for the step's prompts (the rollout engine, with MWRA's budget),
   scored on text with GRPO advantages per own group; with ``algorithm.dynamic_sampling``, topped up with mixed groups
   from extra prompts (:mod:`mutual_rl.step.dynamic`). Each policy's groups are published to the exchange.
2. Stored-peer mode: the recorded peers' groups for this step's prompts come out of the exchange.
3. :func:`train_policy` -- per receiver: its learning rate, what its regime requests before it plans (the
   receiver's log-probs of crossed peer text, counts over every process: :mod:`mutual_rl.step.scoring`, the one
   place a regime's forwards and collectives run), its plan from its own and the delivered peer groups and those
   answers, the aligned traces and the THL residual of what crossed, the exchange's accounting of every delivered
   response, the update (:func:`mutual_rl.update.loop.update_policy`) and the engine's weight sync.
4. The exchange closes the step (flow counts); under several processes the report is reduced over ranks
   (:func:`~mutual_rl.step.report.reduce_over_ranks`).

An exception in the engine's ``generate`` or ``sync_weights`` is a :class:`~mutual_rl.step.faults.RolloutFault`
naming the policy, the phase and the step: raised at once from ``generate`` (carrying the sampling streams of the
step's start), kept until the step is finished from ``sync_weights`` (:mod:`mutual_rl.step.faults`).

The host -- :class:`mutual_rl.module.MutualRLModule` under Lightning, or a script -- supplies a :class:`StepContext`:
the policies, regimes, engine, exchange, reward and optimizers, and how to run a backward pass and an optimizer step.
Both hosts set it up with the one builder, :mod:`mutual_rl.step.build` (a script through
:meth:`StepContext.from_policies`). Logging, step counters, checkpoints and exports stay with the host.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from mutual_rl.distributed import lockstep_needed
from mutual_rl.exchange import trace_records
from mutual_rl.interfaces import Regime, RolloutEngine
from mutual_rl.model.spec import PolicySpec
from mutual_rl.regimes.crossing import thl_residual
from mutual_rl.rewards import RewardError
from mutual_rl.rng import rng_state
from mutual_rl.step.build import build_optimizers, prepare_policies, receiver_regimes, subscribe_receivers
from mutual_rl.step.build import decay_ends as policy_decay_ends
from mutual_rl.step.dynamic import Sampled, dynamic_sample, sample_round
from mutual_rl.step.faults import RolloutFault, collect_sync_faults, engine_name, raise_fault_together
from mutual_rl.step.report import PolicyStepReport, StepReport, reduce_over_ranks
from mutual_rl.step.scoring import answer, receiver_logp
from mutual_rl.types import PromptBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import update_policy
from mutual_rl.update.packing import token_budget
from mutual_rl.update.schedule import set_lr
from mutual_rl.update.scoring import score_groups


@dataclass
class StepContext:
    """What a training step works with (module docstring). ``optimizers`` are the policies' torch optimizers by
    name; ``backward(loss)`` and ``optimizer_step(optimizer)`` default to ``loss.backward()`` and
    ``optimizer.step()`` (Lightning's manual optimization passes its own)."""

    specs: Sequence[PolicySpec]
    policies: Mapping[str, torch.nn.Module]
    regimes: Mapping[str, Regime]
    algorithm: GRPOConfig
    engine: RolloutEngine
    exchange: object
    """The Shared Experience Exchange (:class:`mutual_rl.exchange.ExperienceExchange`), receivers subscribed."""
    reward_fn: Callable
    optimizers: Mapping[str, torch.optim.Optimizer]
    backward: Callable[[torch.Tensor], None] = field(default=lambda loss: loss.backward())
    optimizer_step: Callable[[torch.optim.Optimizer], None] = field(default=lambda opt: opt.step())
    budgets: Mapping[str, object] = field(default_factory=dict)
    """MWRA's budget of each policy for this step (``n``, ``max_new_tokens``, ``update``, ``placement``)."""
    datamodule: object = None
    """Where dynamic sampling draws its extra prompts (``train_problems()``)."""
    decay_ends: Mapping[str, int | None] = field(default_factory=dict)
    """The step each policy's learning-rate decay ends (:func:`mutual_rl.update.schedule.decay_end`)."""
    thl_residual_every_n_steps: int = 10
    sync_faults: list | None = None
    """Where a failed ``sync_weights`` is kept (:class:`~mutual_rl.step.faults.RolloutFault`) for the host to raise
    before the engine is used again; None: raised at the end of the step (:mod:`mutual_rl.step.faults`)."""

    @classmethod
    def from_policies(cls, policies: Sequence, regime: Regime | str = "none", *, reward: str | Callable = "integer_match",
                      algorithm: GRPOConfig | None = None, engine: RolloutEngine | None = None,
                      exchange=None, max_steps: int | None = None, **kwargs) -> StepContext:
        """A step over built policies (:func:`mutual_rl.model.build_policy`; with ``needs_reference=True`` when
        ``algorithm.kl_coef > 0``) outside Lightning, set up by the builder ``mutual-rl fit`` uses
        (:mod:`mutual_rl.step.build`): each receiver its own copy of its regime -- the policy's own
        ``spec.regime``, else ``regime`` (a :class:`Regime` or a registered name) -- with
        ``algorithm.success_threshold``; an :class:`~mutual_rl.exchange.ExperienceExchange` (nothing stored) each
        receiver is subscribed to; one AdamW per policy with its ``optimizer`` settings; the step each policy's
        learning-rate decay ends (its ``optimizer.decay_steps``, else ``max_steps``, as ``trainer.max_steps`` under
        ``mutual-rl fit``: a cosine or linear schedule needs one of them); the HF engine and ``reward`` (a
        registered name, ``module:function`` or a callable). ``kwargs``: the other fields.

        Run with the same policies, batches and sampling streams (:mod:`mutual_rl.rng`), ``run_step`` on this
        context gives the weights and reports of ``mutual-rl fit`` (``tests/step/test_one_py``)."""
        from mutual_rl.exchange import ExperienceExchange
        from mutual_rl.rewards import build_reward
        from mutual_rl.rollout import HFRolloutEngine

        algorithm = algorithm or GRPOConfig()
        specs = [p.spec for p in policies]
        by_name = {p.name: p for p in policies}
        regimes = receiver_regimes(specs, regime, algorithm)
        exchange = exchange if exchange is not None else ExperienceExchange()
        subscribe_receivers(exchange, specs, regimes)
        prepare_policies(by_name)
        if "decay_ends" not in kwargs:
            kwargs["decay_ends"] = policy_decay_ends(specs, max_steps)
        return cls(specs=specs, policies=by_name, regimes=regimes, algorithm=algorithm,
                   engine=engine or HFRolloutEngine(), exchange=exchange,
                   reward_fn=build_reward(reward) if isinstance(reward, str) else reward,
                   optimizers=build_optimizers(specs, by_name), **kwargs)


def run_step(ctx: StepContext, batch: PromptBatch, step: int) -> StepReport:
    """One training step of every policy on ``batch`` (module docstring). A step that raises is abandoned in the
    exchange (not accounted, not stored), so the host can go on or resume."""
    ctx.exchange.begin_step(step)
    try:
        return _run_step(ctx, batch, step)
    except BaseException:
        ctx.exchange.abandon_step()
        raise


def _run_step(ctx: StepContext, batch: PromptBatch, step: int) -> StepReport:
    ex = ctx.exchange
    rng = rng_state()  # a generate fault carries the streams of the step's start (step/faults.py)
    sampled: dict[str, Sampled] = {}
    for spec in ctx.specs:
        error = None
        try:
            sampled[spec.name] = sample_policy(ctx, spec, batch, step)
        except (RewardError, RolloutFault) as e:  # several processes: every rank stops, none waits in a collective
            error = e
        if isinstance(error, RolloutFault):
            error.rng = rng
        raise_fault_together(error, RolloutFault(None, engine_name(ctx.engine), "generate", step, None, rng),
                             f"sampling or scoring policy {spec.name!r}'s rollouts")
        for g in sampled[spec.name].groups:
            ex.publish(g)
    replayed = {}
    if ex.replayed_policies:  # stored-peer mode: recorded peers' groups for this step's prompts
        for name, gs in ex.replay_groups(step, [p.prompt_id for p in batch.problems]).items():
            replayed[name] = float(torch.cat([g.rewards for g in gs]).mean()) if gs else 0.0
    faults: list[RolloutFault] = []
    reports = {spec.name: train_policy(ctx, spec, sampled[spec.name], step, faults) for spec in ctx.specs}
    report = reduce_over_ranks(StepReport(step, reports, ex.end_step(), replayed))
    faults = collect_sync_faults(faults, RolloutFault(None, engine_name(ctx.engine), "sync_weights", step, None))
    if faults and ctx.sync_faults is not None:
        ctx.sync_faults.extend(faults)
    elif faults:
        faults[0].report = report
        raise faults[0]
    return report


def sample_policy(ctx: StepContext, spec: PolicySpec, batch: PromptBatch, step: int) -> Sampled:
    """One policy's scored groups of the step; with ``algorithm.dynamic_sampling`` its mixed groups topped up from
    extra prompts (not on a step it does not update)."""
    sampling, budget = spec.sampling, ctx.budgets.get(spec.name)
    if budget is not None:  # MWRA: rollouts per prompt, max new tokens and rollout placement for this step
        sampling = dataclasses.replace(sampling, n=budget.n, max_new_tokens=budget.max_new_tokens)
        ctx.engine.place(spec.name, budget.placement)
    policy, a = ctx.policies[spec.name], ctx.algorithm

    def generate(problems, group_id_base: int):
        try:
            return ctx.engine.generate(policy, problems, sampling, step=step, group_id_base=group_id_base)
        except Exception as e:  # noqa: BLE001 - any engine failure: one fault naming the policy and the step
            raise RolloutFault(spec.name, engine_name(ctx.engine), "generate", step, e) from e

    def score(problems, per_prompt):
        return score_groups(spec.name, problems, per_prompt, ctx.reward_fn, eps=a.eps, scale=a.scale,
                            success_threshold=a.success_threshold)

    if not a.dynamic_sampling or (budget is not None and not budget.update):
        return sample_round(generate, score, batch.problems, batch.offset)
    return dynamic_sample(generate, score, batch, step=step, max_rounds=a.dynamic_sampling_max_rounds,
                          datamodule=ctx.datamodule, lockstep=lockstep_needed(policy.model))


def train_policy(ctx: StepContext, spec: PolicySpec, sampled: Sampled, step: int,
                 faults: list | None = None) -> PolicyStepReport:
    """One receiver's learning in the step (module docstring, phase 3); a policy MWRA does not update this step
    consumes none of its deliveries (each counted dropped ``over_budget``). A failed ``sync_weights`` is appended to
    ``faults`` as a :class:`~mutual_rl.step.faults.RolloutFault` (raised at once when ``faults`` is None)."""
    name, ex = spec.name, ctx.exchange
    report = PolicyStepReport(name, sampled.rollout, sampled.scoring, sampled.dynamic_sampling,
                              groups=tuple(sampled.groups))
    budget = ctx.budgets.get(name)
    if budget is not None and not budget.update:
        for source, gs in ex.deliveries(name).items():
            ex.report(name, source, consumed=0, dropped={"over_budget": sum(len(g.rollouts) for g in gs)} if gs else {})
        return report
    policy, regime, optimizer = ctx.policies[name], ctx.regimes[name], ctx.optimizers[name]
    t0 = time.perf_counter()
    lr = set_lr(optimizer, spec.optimizer, step, ctx.decay_ends.get(name))
    delivered = ex.deliveries(name)
    budget = token_budget(policy, ctx.algorithm.max_tokens_per_micro_batch)
    scores = answer(policy, regime.request(policy, sampled.groups, delivered), budget,  # forwards, collectives
                    ctx.algorithm.micro_batch_size)
    plan = regime.plan(policy, sampled.groups, delivered, ctx.algorithm.num_mini_batches, scores)
    if plan.crossed:  # aligned traces (PRP peer_aligned) go with the step's traffic (stored, not delivered)
        traces = trace_records(plan.crossed, [g for gs in delivered.values() for g in gs])
        if traces:
            ex.publish(traces)
    thl = {}
    every = ctx.thl_residual_every_n_steps
    if plan.crossed is not None and every and step % every == 0:
        thl = thl_residual(plan.crossed, receiver_logp(policy, plan.crossed, budget, ctx.algorithm.micro_batch_size),
                           granularity=regime.granularity)
    for source, flow in plan.flows.items():
        ex.report(name, source, consumed=flow.get("consumed", 0),
                  dropped={k: v for k, v in flow.items() if k != "consumed"})
    stats = update_policy(policy, plan, ctx.algorithm, backward=ctx.backward,
                          step_optimizer=lambda: ctx.optimizer_step(optimizer),
                          zero_grad=lambda: optimizer.zero_grad(set_to_none=True))
    stats = dataclasses.replace(stats, lr=lr, train_s=time.perf_counter() - t0)
    sync = None
    try:
        sync = ctx.engine.sync_weights(policy)  # engines holding their own copy of the weights (vLLM): push it
    except Exception as e:  # noqa: BLE001 - the update stands; the step finishes, the host stops before the next use
        fault = RolloutFault(name, engine_name(ctx.engine), "sync_weights", step, e)
        fault.__cause__ = e
        if faults is None:
            raise fault from e
        faults.append(fault)
    return dataclasses.replace(report, update=stats, regime=plan.metrics, sync=sync, thl=thl,
                               histograms=dict(plan.histograms))

