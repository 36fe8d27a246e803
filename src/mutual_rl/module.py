"""MutualRLModule: N heterogeneous policies, one LightningModule, manual optimization.

The module orchestrates and holds no math: per training step it samples each policy's groups (rollout engine),
scores them on text (rewards), computes GRPO advantages per own group (algorithms), lets each receiver's regime
build its training plan from its own and its peers' groups (regimes), and runs each policy's update
(update.loop). ``max_steps`` counts training steps: every optimizer step goes through the strategy without
touching Lightning's step counter, which the module advances once per training step.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch import LightningModule
from torch import nn

from mutual_rl.distributed import (
    gather_objects,
    lockstep_needed,
    mean_over_ranks,
    raise_together,
    rank_and_world,
    rank_part,
)
from mutual_rl.evaluation.validation import EvalConfig, Evaluator
from mutual_rl.exchange import ExperienceExchange, trace_records
from mutual_rl.model.export import export_policies, step_folder
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec
from mutual_rl.regimes import Regime, as_regime, regime_name
from mutual_rl.regimes.crossing import thl_residual
from mutual_rl.resume import apply_optimizer_settings, match_policies_by_name
from mutual_rl.rewards import RewardError, RewardTerm, build_reward
from mutual_rl.rollout import RolloutEngine, get_engine
from mutual_rl.step.dynamic import check_dynamic_sampling, dynamic_sample, sample_round
from mutual_rl.step_metrics import (
    COUNT_PREFIXES,
    COUNT_SUFFIXES,
    fill_absent,
    log_histograms,
    log_samples,
    warn_on_collapse,
)
from mutual_rl.strategies import has_activation_checkpointing
from mutual_rl.threads import check_num_threads, configure_threads
from mutual_rl.types import PromptBatch, ScoredGroup
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.loop import update_policy
from mutual_rl.update.schedule import decay_end, set_lr
from mutual_rl.update.scoring import score_groups
from mutual_rl.warnings_filters import ignore_inapplicable_warnings, warn_on_true_half_precision


class MutualRLModule(LightningModule):
    def __init__(
        self,
        policies: list[PolicySpec],
        algorithm: GRPOConfig = GRPOConfig(),  # noqa: B008 (read-only default; shows in --help)
        regime: Regime | str = "none",
        reward: str | list[RewardTerm] | None = None,
        evaluation: EvalConfig = EvalConfig(),  # noqa: B008
        rollout_engine: RolloutEngine | str = "hf",
        log_samples_every_n_steps: int = 50,
        eval_at_start: bool = True,
        export_dir: str | None = None,
        cache_dir: str | None = None,
        reward_timeout_s: float = 5.0,
        reward_errors: Literal["raise", "skip"] = "raise",
        prompt_overflow: Literal["error", "truncate"] = "error",
        thl_residual_every_n_steps: int = 10,
        num_threads: int | None = None,
        export_every_n_steps: int = 0,
    ):
        """
        Args:
            policies: the N >= 1 policies trained together (each with its own model, tokenizer, prompt
                format, optimizer and sampling settings).
            algorithm: GRPO/DAPO settings shared by all policies.
            regime: sharing regime of every receiver unless a policy sets its own, as class_path (NoSharing,
                XGRPO, PRP, SGT, GRAFT, HACPO, FTIS, or a full import path) with init_args, e.g. {class_path:
                SGT, init_args: {coef: 0.3}}; or a registered name with default arguments (none, xgrpo, prp,
                sgt, graft, hacpo, ftis). Each receiver gets its own copy. See --model.regime.help SGT for one regime's
                arguments.
            reward: registered name or package.module:function (default: the task's), or a weighted list of terms,
                e.g. [{fn: math_verify, weight: 1.0}, {fn: boxed_format, weight: 0.2}] (mutual_rl.rewards.combined).
            evaluation: held-out evaluation settings (validation loop and mutual-rl validate).
            rollout_engine: how rollouts are sampled, as class_path HFRolloutEngine (Hugging Face generate,
                CPU/GPU) or VLLMRolloutEngine (GPU; pip install mutual-rl[vllm]) with init_args; or the name hf
                or vllm with default arguments.
            log_samples_every_n_steps: write sample completions to TensorBoard this often (0 = never).
            eval_at_start: evaluate on the held-out split before the first training step (logged at step 0),
                so every curve starts from the warm-started policies.
            export_dir: where each policy is saved in Hugging Face format at the end of fit, as
                <export_dir>/<policy> (default: <log_dir>/export).
            export_every_n_steps: also export every this many training steps, to
                <export_dir>/step-<NNNNNN>/<policy> (0 = only at the end of fit).
            cache_dir: cache root of the embedded tiny presets (default: $MUTUAL_RL_CACHE or
                ~/.cache/mutual_rl).
            reward_timeout_s: seconds one reward call may take per completion (a TRL-style call on a group of
                n completions may take n times this; math_verify uses it as its worker's limit). Past it: a timeout.
            reward_errors: what a reward call that raises, times out, or returns None/NaN/inf/a non-number
                does: raise (stop with an error naming the reward, the completion and the answer) or
                skip (score it 0.0 and count it in <policy>/reward_errors / <policy>/reward_timeouts,
                logged per step). math-verify timeouts always score 0.0 and are counted.
            prompt_overflow: a prompt whose tokens plus a policy's sampling.max_new_tokens exceed that
                policy's context length (model config max_position_embeddings/n_positions, else the
                tokenizer's model_max_length), checked over the train and held-out prompts when the policies are
                built: error (stop, naming the policy, the prompts and both lengths) or truncate (keep the
                prompt's last tokens; the count is logged once per policy).
            thl_residual_every_n_steps: every this many steps (and at step 0), for each receiver whose regime
                carries peer responses across tokenizers (prp, sgt, graft, hacpo), log how far the THL-aligned peer
                trace is from the receiver's own log-probs, per direction: thl/<source>-><receiver>/residual_mean,
                residual_p90, residual_max (nats per token) and group_count_mismatch. Costs one no-grad receiver
                forward over the crossed responses; 0 = never.
            num_threads: CPU threads torch uses in this process (set when fit or validate starts). Default: torch's
                own count, capped at the cores this process may use divided by the processes of the run on this
                node. Running several jobs side by side on one machine, give each cores / jobs.
        """
        super().__init__()
        if not policies:
            raise ValueError("model.policies is empty: give at least one policy.")
        names = [p.name for p in policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique, got {names}.")
        self.automatic_optimization = False
        self.specs = list(policies)
        self.algorithm = algorithm or GRPOConfig()
        shared = as_regime(regime)
        self.regime_name = regime_name(shared)
        # every receiver its own instance (regimes may keep state); one source of success_threshold
        self.regimes = {p.name: copy.deepcopy(as_regime(p.regime) if p.regime is not None else shared)
                        for p in self.specs}
        for r in self.regimes.values():
            r.success_threshold = self.algorithm.success_threshold
        check_dynamic_sampling(self.algorithm, self.specs, self.regimes)  # only without sharing
        self._own_exchange = None
        self.budgets: dict = {}  # policy -> budget (n, max_new_tokens, update), set by the MWRA callback per step
        self.reward_name = reward
        self.evaluation = evaluation or EvalConfig()
        self.log_samples_every_n_steps = log_samples_every_n_steps
        self.eval_at_start = eval_at_start
        self.export_dir, self.cache_dir = export_dir, cache_dir
        if export_every_n_steps < 0:
            raise ValueError(f"model.export_every_n_steps must be >= 0 (0 = only at the end of fit), got {export_every_n_steps}.")
        self.export_every_n_steps = int(export_every_n_steps)
        self._decay_ends: dict[str, int | None] = {}  # policy -> step its LR decay ends (update/schedule.py)
        self.policies = nn.ModuleDict()
        self.engine = get_engine(rollout_engine) if isinstance(rollout_engine, str) else rollout_engine
        self._rng_to_restore = None
        self._offset_rng_per_rank = False
        self._logged_keys: set[str] = set()  # every step metric ever logged (step_metrics.fill_absent)
        self._collapse_warned: set[str] = set()
        from mutual_rl.data.prompt_length import check_prompt_overflow_mode
        from mutual_rl.rewards.guard import check_reward_settings

        check_reward_settings(reward_timeout_s, reward_errors)
        check_prompt_overflow_mode(prompt_overflow)
        self.reward_timeout_s, self.reward_errors = reward_timeout_s, reward_errors
        self.prompt_overflow = prompt_overflow
        if thl_residual_every_n_steps < 0:
            raise ValueError(f"model.thl_residual_every_n_steps must be >= 0 (0 = never), got {thl_residual_every_n_steps}.")
        self.thl_residual_every_n_steps = int(thl_residual_every_n_steps)
        check_num_threads(num_threads)
        self.num_threads = num_threads
        self.prompts_truncated: dict[str, int] = {}  # policy -> prompts cut to fit its context (prompt_overflow)

    # ------------------------------------------------------------------------------------------ set-up
    def configure_model(self) -> None:
        if len(self.policies):
            return
        task = getattr(self._datamodule(), "task", None)
        for spec in self.specs:
            self.policies[spec.name] = build_policy(
                spec, task=task, cache_dir=self.cache_dir, needs_reference=self.algorithm.kl_coef > 0
            )
        from mutual_rl.data.prompt_length import check_prompt_lengths

        dm = self._datamodule()
        if hasattr(dm, "train_problems"):  # every prompt fits every policy's context, or is truncated
            self.prompts_truncated = check_prompt_lengths(
                list(self.policies.values()), list(dm.train_problems()), mode=self.prompt_overflow,
                eval_max_new_tokens=self.evaluation.max_new_tokens,
                val_problems=list(dm.val_problems()) if hasattr(dm, "val_problems") else [])
        name = self.reward_name or getattr(task, "default_reward", "integer_match")
        self.reward_fn = build_reward(name, timeout_s=self.reward_timeout_s, errors=self.reward_errors)
        self.evaluator = Evaluator(self.evaluation, self.reward_fn, self.engine)

    def configure_optimizers(self):
        """One AdamW per policy, in ``model.policies`` order, with that policy's ``optimizer`` settings.

        Resuming restores each AdamW's state *and* its checkpointed settings; a post-load hook then puts back the
        configured ``lr``, ``betas``, ``weight_decay`` and ``eps`` (:func:`mutual_rl.resume.apply_optimizer_settings`).
        """
        opts = []
        for spec in self.specs:
            params = [p for p in self.policies[spec.name].parameters() if p.requires_grad]
            o = spec.optimizer
            opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, eps=o.eps)
            opt.register_load_state_dict_post_hook(
                lambda optimizer, spec=spec: apply_optimizer_settings(spec, optimizer, self.print))
            opts.append(opt)
        return opts

    @property
    def exchange(self):
        """The Shared Experience Exchange: the ``ExperienceExchange`` callback if the trainer has one, else a
        private one (accounting is always checked; nothing is stored)."""
        for cb in getattr(self._trainer, "callbacks", []) if self._trainer is not None else []:
            if isinstance(cb, ExperienceExchange):
                ex = cb
                break
        else:
            if self._own_exchange is None:
                self._own_exchange = ExperienceExchange()
            ex = self._own_exchange
        if not getattr(ex, "_mutual_rl_subscribed", False):
            for spec in self.specs:
                regime = self.regimes[spec.name]
                ex.subscribe(spec.name, set(regime.subscribes), regime=regime_name(regime))
            ex._mutual_rl_subscribed = True
        return ex

    def _datamodule(self):
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # prompts are text; tensors are built per policy on its own device

    # ------------------------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int):
        step, ex = self.global_step, self.exchange
        ex.begin_step(step)
        groups: dict[str, list[ScoredGroup]] = {}
        metrics: dict[str, float] = {}
        for spec in self.specs:
            error = None
            try:
                groups[spec.name], m = self._rollout_and_score(spec, batch, step)
            except RewardError as e:  # several processes: every rank stops, none waits in the next collective
                error = e
            raise_together(error, f"scoring policy {spec.name!r}'s rollouts")
            metrics.update({f"{spec.name}/{k}": v for k, v in m.items()})
            for g in groups[spec.name]:
                ex.publish(g)
        if ex.replayed_policies:  # stored-peer mode: recorded peers' groups for this step's prompts
            for name, gs in ex.replay_groups(step, [p.prompt_id for p in batch.problems]).items():
                metrics[f"{name}/reward"] = float(torch.cat([g.rewards for g in gs]).mean()) if gs else 0.0
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        hists: dict[str, torch.Tensor] = {}
        for spec, opt in zip(self.specs, optimizers):
            policy = self.policies[spec.name]
            budget = self.budgets.get(spec.name)
            if budget is not None and not budget.update:  # MWRA: this policy does not update this step
                for source, gs in ex.deliveries(spec.name).items():
                    ex.report(spec.name, source, consumed=0,
                              dropped={"over_budget": sum(len(g.rollouts) for g in gs)} if gs else {})
                continue
            t0 = time.perf_counter()
            metrics[f"{spec.name}/lr"] = set_lr(opt.optimizer, spec.optimizer, step, self._decay_ends.get(spec.name))
            delivered = ex.deliveries(spec.name)
            plan = self.regimes[spec.name].plan(policy, groups[spec.name], delivered,
                                                 self.algorithm.num_mini_batches)
            if plan.crossed:  # aligned traces (PRP peer_aligned) go with the step's traffic (stored, not delivered)
                traces = trace_records(plan.crossed, [g for gs in delivered.values() for g in gs])
                if traces:
                    ex.publish(traces)
            every = self.thl_residual_every_n_steps
            if plan.crossed is not None and every and step % every == 0:
                granularity = getattr(self.regimes[spec.name], "granularity", "word")  # the regime's own, if any
                metrics.update(thl_residual(policy, plan.crossed, granularity=granularity))
            for source, flow in plan.flows.items():
                ex.report(spec.name, source, consumed=flow.get("consumed", 0),
                          dropped={k: v for k, v in flow.items() if k != "consumed"})
            m = update_policy(
                policy, plan, self.algorithm, backward=self.manual_backward,
                step_optimizer=lambda o=opt: self.trainer.strategy.optimizer_step(o.optimizer, lambda: None, self),
                zero_grad=lambda o=opt: o.zero_grad(set_to_none=True),
            )
            m["train_s"] = time.perf_counter() - t0
            m["train_tokens_per_s"] = m["trained_tokens"] / max(m["train_s"], 1e-9)
            sync = getattr(self.engine, "sync_weights", None)
            if sync is not None:  # engines that hold their own copy of the weights (vLLM): push the update
                m.update(sync(policy) or {})
            for k, v in {**m, **plan.metrics}.items():
                if k.startswith("hist/"):
                    hists[f"{spec.name}/{k[5:]}"] = torch.as_tensor(v)
                else:
                    metrics[f"{spec.name}/{k}"] = float(v)
        metrics.update(ex.end_step())
        # several processes: every rank logs (and plans from) the same values; exchange counts and the reward-error
        # and reward-timeout counts are global totals, everything else per-rank means (refused steps are agreed) (per-policy token counts: per rank, see ResourceAllocation)
        metrics = mean_over_ranks(metrics, sum_prefixes=COUNT_PREFIXES, sum_suffixes=COUNT_SUFFIXES)
        fill_absent(metrics, self._logged_keys)  # after the reduction: a gap only where no rank logged the key
        warn_on_collapse(metrics, self.specs, step, self._collapse_warned)
        self._advance_step_counter()
        dm = self._datamodule()
        if dm is not None and hasattr(dm, "mark_consumed"):
            dm.mark_consumed(batch.index)
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(batch.problems))
        self.log("reward", sum(metrics[f"{s.name}/reward"] for s in self.specs) / len(self.specs), prog_bar=True,
                 batch_size=len(batch.problems))
        log_histograms(self.logger, hists, step)
        log_samples(self.logger, groups, batch, step, self.log_samples_every_n_steps)
        if self.export_every_n_steps and (step + 1) % self.export_every_n_steps == 0:
            export_policies(self.policies, step_folder(self._export_root(), step + 1),
                            write=self.trainer.is_global_zero)

    def _rollout_and_score(self, spec: PolicySpec, batch: PromptBatch, step: int):
        """This step's scored groups of one policy and their metrics; with ``algorithm.dynamic_sampling`` its mixed
        groups topped up from extra prompts (:mod:`mutual_rl.step.dynamic`; not on a step it does not update)."""
        sampling = spec.sampling
        budget = self.budgets.get(spec.name)
        if budget is not None:  # MWRA: rollouts per prompt, max new tokens and rollout placement for this step
            sampling = dataclasses.replace(sampling, n=budget.n, max_new_tokens=budget.max_new_tokens)
            place = getattr(self.engine, "place", None)
            if place is not None:
                place(spec.name, budget.placement)
        policy, a = self.policies[spec.name], self.algorithm

        def generate(problems, group_id_base: int):
            return self.engine.generate(policy, problems, sampling, step=step, group_id_base=group_id_base)

        def score(problems, per_prompt):
            return score_groups(spec.name, problems, per_prompt, self.reward_fn, eps=a.eps, scale=a.scale,
                                success_threshold=a.success_threshold)

        if not a.dynamic_sampling or (budget is not None and not budget.update):
            return sample_round(generate, score, batch.problems, batch.offset)
        return dynamic_sample(generate, score, batch, step=step, max_rounds=a.dynamic_sampling_max_rounds,
                              datamodule=self._datamodule(), lockstep=lockstep_needed(policy.model))

    def _advance_step_counter(self) -> None:
        """One training step = one ``global_step``, however many optimizer steps the policies took."""
        if self._trainer is None:
            return
        progress = self.trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        progress.increment_ready()
        progress.increment_completed()

    # ---------------------------------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        self.evaluator.start(self.evaluation.seed)

    def validation_step(self, batch: PromptBatch, batch_idx: int):
        problems = rank_part(batch.problems, *rank_and_world())  # several processes: each evaluates its part
        for spec in self.specs:
            self.evaluator.add(self.policies[spec.name], problems)

    def on_validation_epoch_end(self) -> None:
        flat = self._eval_metrics()
        mean = flat.pop("val_pass@1", None)
        if flat:
            self.log_dict(flat, on_epoch=True)
        if mean is not None:
            self.log("val_pass@1", mean, prog_bar=True, on_epoch=True)

    def _eval_metrics(self) -> dict[str, float]:
        """Finish the evaluation: ``<policy>/val/<metric>``, complementarity (NaN-free) and ``val_pass@1``."""
        results = self.evaluator.finish()
        flat = {f"{p}/val/{k}": v for p, ms in results.items() for k, v in ms.items()}
        flat.update({k: v for k, v in self.evaluator.complementarity().items() if v == v})
        if results:
            flat["val_pass@1"] = sum(ms["pass@1"] for ms in results.values()) / len(results)
        return flat

    # --------------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():  # sampling on GPUs draws from the accelerator's generators
            rng["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint["mutual_rl"] = {
            "rng": rng,
            "rng_per_rank": gather_objects(rng),  # several processes: each rank resumes its own sampling stream
            "policies": [spec.name for spec in self.specs],  # the order of checkpoint["optimizer_states"]
            "versions": {name: p.version for name, p in self.policies.items()},
            "regimes": {name: r.state_dict() for name, r in self.regimes.items()},
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Restore sampling streams, policy versions and regime states, matching policies by **name**.

        The checkpoint's policies and ``model.policies`` must hold the same names, in any order (else one error
        naming both lists); ``checkpoint["optimizer_states"]`` is reordered to ``model.policies`` order so every
        AdamW gets its own policy's state. A checkpoint without mutual-rl state is an error.
        """
        if "mutual_rl" not in checkpoint:
            raise ValueError(f"checkpoint {self._ckpt_label()} is not a mutual-rl checkpoint (no 'mutual_rl' state): "
                             "give a checkpoint written by mutual-rl fit, or omit ckpt_path.")
        state = checkpoint["mutual_rl"]
        strategy = self.trainer.strategy if self._trainer is not None else None
        match_policies_by_name(
            checkpoint, list(state.get("policies") or state.get("versions", {})), [s.name for s in self.specs],
            self._ckpt_label(),
            type(strategy).__name__ if strategy is not None and strategy.restore_checkpoint_after_setup else None)
        rank, world = rank_and_world()
        per_rank = state.get("rng_per_rank") or [state.get("rng")]
        if len(per_rank) == world:
            self._rng_to_restore = per_rank[rank]
        else:  # another world size: rank 0's stream, offset per rank below
            self._rng_to_restore = per_rank[0]
            self._offset_rng_per_rank = world > 1
        for name, v in state.get("versions", {}).items():
            if name in self.policies:
                self.policies[name].version = v
        for name, r_state in state.get("regimes", {}).items():
            if name in self.regimes:
                self.regimes[name].load_state_dict(r_state)

    def _ckpt_label(self) -> str:
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        return repr(str(path)) if path else "(given)"

    def setup(self, stage: str) -> None:
        """Before fit: a sharing regime (one that reads peers' records: every built-in regime but ``none``) needs a
        peer -- a second policy in ``model.policies`` or one replayed by the ``ExperienceExchange`` callback
        (stored-peer mode); else it is an error naming the regime. A fit that trains nothing (``max_steps=0``, e.g.
        to build the policies) is not checked. Also silences the Lightning warnings that do not apply here
        (:mod:`mutual_rl.warnings_filters`), sets torch's thread count (:mod:`mutual_rl.threads`) and warns on a
        half-precision ``trainer.precision`` without float32 master weights (:func:`warn_on_true_half_precision`)."""
        ignore_inapplicable_warnings()
        configure_threads(self.num_threads)
        if stage == "fit":
            warn_on_true_half_precision(str(getattr(self.trainer, "precision", "")))
        if stage != "fit" or len(self.specs) > 1 or self.trainer.max_steps == 0:
            return
        callbacks = getattr(self._trainer, "callbacks", []) if self._trainer is not None else []
        if any(getattr(cb, "replayed_policies", None) for cb in callbacks if isinstance(cb, ExperienceExchange)):
            return
        spec = self.specs[0]
        name = regime_name(self.regimes[spec.name])
        if self.regimes[spec.name].subscribes:
            where = "model.policies[0].regime" if spec.regime else "model.regime"
            raise ValueError(
                f"{where} is {name!r}, a sharing regime, but model.policies has the single policy {spec.name!r}: "
                f"it has no peer to learn from. Add a second policy, replay a recorded peer (ExperienceExchange "
                f"replay_dir/replay_policies), or set {where}: none."
            )

    def on_fit_start(self) -> None:
        self._decay_ends = {s.name: decay_end(s.optimizer, self.trainer.max_steps, s.name) for s in self.specs}
        if rank_and_world()[1] > 1 and not all(lockstep_needed(p.model) for p in self.policies.values()):
            raise ValueError("training with several processes needs trainer.strategy MutualFSDPStrategy "
                             "(mutual_rl.strategies): each rank trains its own prompts, and only that strategy keeps "
                             "the ranks' passes in lockstep with global loss normalisers. DDP is not supported.")
        for policy in self.policies.values():
            # FSDP over several ranks: one forward per response_logp call, always (lockstep). Activation
            # checkpointing: the shared prompt's key/value cache would be appended to again when recomputed.
            if lockstep_needed(policy.model) or has_activation_checkpointing(policy.model):
                policy.share_prompts = False

    def on_train_start(self) -> None:
        if self._rng_to_restore is not None:  # after every restore step, so nothing else consumes it first
            torch.set_rng_state(self._rng_to_restore["torch"])
            random.setstate(self._rng_to_restore["python"])
            cuda = self._rng_to_restore.get("cuda")
            if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
            self._rng_to_restore = None
        elif self.global_step == 0:
            self._offset_rng_per_rank = True
        rank, world = rank_and_world()
        if world > 1 and self._offset_rng_per_rank:
            # seed_everything seeds every rank alike; ranks sample their own prompts with their own streams
            seed = int(torch.randint(0, 2**62, (1,)).item()) + 1_000_003 * rank
            torch.manual_seed(seed)
            random.seed(seed)
        self._offset_rng_per_rank = False
        dm = self._datamodule()
        limit = self.trainer.limit_val_batches
        if self.eval_at_start and self.global_step == 0 and hasattr(dm, "val_problems") and limit != 0:
            self._evaluate_now(dm)

    def _evaluate_now(self, dm) -> None:
        """Held-out evaluation outside Lightning's loop (used at step 0); logs directly to the loggers."""
        problems = dm.val_problems()
        self.evaluator.start(self.evaluation.seed)
        for start in range(0, len(problems), dm.val_batch_size):
            part = rank_part(problems[start : start + dm.val_batch_size], *rank_and_world())
            for spec in self.specs:
                self.evaluator.add(self.policies[spec.name], part)
        flat = self._eval_metrics()
        for logger in self.loggers:
            logger.log_metrics(flat, step=0)

    def _export_root(self) -> Path:
        return Path(self.export_dir) if self.export_dir else Path(self.trainer.log_dir or ".") / "export"

    def on_fit_end(self) -> None:
        root = self._export_root()
        export_policies(self.policies, root, write=self.trainer.is_global_zero)
        self.print(f"Exported {len(self.policies)} policies (Hugging Face format) to {root}")
