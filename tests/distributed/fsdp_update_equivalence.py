"""Run under torchrun (2 CPU ranks, gloo): one GRPO update of an FSDP-sharded policy, each rank holding different
prompts, against the one-process update on the union of the ranks' rows. Writes a JSON summary (rank 0).

Exercised on purpose: ranks with different numbers of active (non-zero-advantage) rows and micro-batches, an NLL
term on rank 0 only (rank 1 runs dummy NLL passes), old log-probs recomputed in micro-batches, gradient clipping
over the sharded parameters. Usage: torchrun --nproc-per-node 2 fsdp_update_equivalence.py OUT.json
(env: EQ_MINI mini-batches, EQ_MICRO micro-batch rows, EQ_NLL 1/0 for the NLL term on rank 0, EQ_AGG the loss
aggregation).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mutual_rl.data.task import ArithmeticTask  # noqa: E402
from mutual_rl.model.policy import build_policy  # noqa: E402
from mutual_rl.model.spec import SamplingSpec  # noqa: E402
from mutual_rl.regimes.base import split_rows  # noqa: E402
from mutual_rl.rollout.hf import HFRolloutEngine  # noqa: E402
from mutual_rl.strategies import clean_name, shard_model  # noqa: E402
from mutual_rl.types import NLLTerm, TrainingPlan, collate  # noqa: E402
from mutual_rl.update.config import GRPOConfig  # noqa: E402
from mutual_rl.update.loop import update_policy  # noqa: E402
from mutual_rl.update.scoring import score_groups  # noqa: E402
from tests.module.helpers import TASK, spec  # noqa: E402

PROMPTS_PER_RANK, N, LR = 4, 4, 0.5
MINI, MICRO = int(os.environ.get("EQ_MINI", 2)), int(os.environ.get("EQ_MICRO", 3))
NLL = os.environ.get("EQ_NLL", "1") == "1"
AGG = os.environ.get("EQ_AGG", "token-mean")


MIXED: set[str] = set()  # answers of the problems whose groups get mixed rewards (others: all fail)


def reward(text: str, answer: str) -> float:
    return float(len(text) % 2 == 0) if answer in MIXED else 0.0


def main(out: str) -> None:
    import faulthandler
    faulthandler.dump_traceback_later(60, exit=True)  # a lockstep bug hangs: show where, then fail
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    task = ArithmeticTask(**TASK)
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=task)
    policy.model.eval()  # no dropout anywhere: the comparison is exact up to float rounding
    policy.share_prompts = False
    problems = task.train_problems()[: PROMPTS_PER_RANK * world]
    MIXED.update(p.answer for p in problems[: PROMPTS_PER_RANK + 1])  # rank 1 gets mostly all-fail groups
    per_prompt = HFRolloutEngine().generate(policy, problems, SamplingSpec(n=N, max_new_tokens=5), step=0)
    groups, _ = score_groups("p", problems, per_prompt, reward)  # identical on every rank (same seed)

    def rows_of(gs):
        rollouts = [r for g in gs for r in g.rollouts]
        return rollouts, torch.cat([g.advantages for g in gs])

    parts = [groups[r * PROMPTS_PER_RANK:(r + 1) * PROMPTS_PER_RANK] for r in range(world)]
    local = [split_rows(PROMPTS_PER_RANK * N, MINI) for _ in range(world)]
    pad = policy.tokenizer.pad_token_id
    successes = [r for g in parts[0][:2] for r, x in zip(g.rollouts, g.rewards) if x > 0][:2]
    nll_batch = collate(successes, torch.zeros(len(successes)), pad) if successes and NLL else None
    cfg = GRPOConfig(num_mini_batches=MINI, micro_batch_size=MICRO, old_logp="recompute", agg=AGG)

    # reference: one process, the union of both ranks' rows; global mini-batch i = the ranks' i-th mini-batches
    ref = copy.deepcopy(policy)
    rollouts, adv = rows_of(groups)
    union = TrainingPlan(collate(rollouts, adv, pad), [
        [r * PROMPTS_PER_RANK * N + j for r in range(world) for j in local[r][i]] for i in range(MINI)])
    if nll_batch is not None:
        union.nll = NLLTerm(nll_batch, [list(range(len(successes))), []], coef=0.5)
    ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR)
    update_policy(ref, union, cfg, backward=lambda loss: loss.backward(), step_optimizer=ref_opt.step,
                  zero_grad=lambda: ref_opt.zero_grad(set_to_none=True))

    # sharded: this rank's rows only
    layers = {type(m) for m in policy.model.modules() if type(m).__name__ == "GPT2Block"}
    before = {clean_name(n): p.detach().clone() for n, p in policy.model.named_parameters()}
    policy.model = shard_model(policy.model, layers, torch.device("cpu"))
    mine_rollouts, mine_adv = rows_of(parts[rank])
    plan = TrainingPlan(collate(mine_rollouts, mine_adv, pad), local[rank])
    if rank == 0 and nll_batch is not None:
        plan.nll = NLLTerm(nll_batch, [list(range(len(successes))), []], coef=0.5)
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=LR)
    metrics = update_policy(policy, plan, cfg, backward=lambda loss: loss.backward(), step_optimizer=opt.step,
                            zero_grad=lambda: opt.zero_grad(set_to_none=True))
    active = int((mine_adv != 0).sum())
    all_active = [None] * world
    dist.all_gather_object(all_active, active)

    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(policy.model, writeback=False):
        got = {clean_name(n): p.detach().clone() for n, p in policy.model.named_parameters()}
    want = {clean_name(n): p.detach() for n, p in ref.model.named_parameters()}
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))[:5]
    diff = max(float((got[k] - want[k]).abs().max()) for k in got)
    change = max(float((want[k] - before[k]).abs().max()) for k in got)
    if rank == 0:
        Path(out).write_text(json.dumps({
            "max_diff": diff, "max_change": change, "active_rows_per_rank": all_active,
            "nll_rows": len(successes), "version": policy.version, "grad_norm": metrics.grad_norm,
        }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
