"""Every forward and collective a regime needs before it plans, run by the step in one place.

A regime states what it needs (``Regime.request``: crossed peer responses to score with the receiver, numbers to
agree on over every process) and plans from the answers (``Regime.plan(..., scores)``); :func:`answer` computes
them. The receiver's log-probs of crossed rows run in no-grad forwards packed to the step's token budget
(``algorithm.max_tokens_per_micro_batch``, ``update/packing.py``): rows sorted by length fill each forward while
rows x (longest prompt + longest response) stays within the budget, each forward on its own width. Each row's
log-probs depend only on its own tokens, so the packing moves values by float rounding only (tested against one
forward per row within 1e-6). Under FSDP with several ranks every rank runs as many forwards as the busiest one
(``distributed.padded``: one-row dummies), and the sums and maxima are one collective each.

The THL residual report of a step scores its crossed rows the same way (:func:`receiver_logp`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mutual_rl.distributed import agree_max, agree_sum, padded
from mutual_rl.interfaces import Regime
from mutual_rl.types import CrossedRollout, ScoredGroup, Scores, ScoringRequest, TrainingPlan, collate
from mutual_rl.update.packing import DEFAULT_TOKEN_BUDGET, lengths, narrow, pack


@torch.no_grad()
def receiver_logp(receiver, crossed: Sequence[CrossedRollout], budget: int = DEFAULT_TOKEN_BUDGET,
                  max_rows: int = 0) -> list[torch.Tensor]:
    """Per crossed row: the receiver's log-probs ``[T]`` of its response tokens (current weights, the receiver's
    sampling temperature), float32 on the CPU as the records; forwards of at most ``budget`` token positions and
    ``max_rows`` rows (0: no row limit). Under FSDP with several ranks every rank must call it, with or without
    rows."""
    temperature = receiver.spec.sampling.temperature
    batch = collate(list(crossed), torch.zeros(len(crossed)), receiver.tokenizer.pad_token_id) if crossed else None
    parts: list[list[int]] = []
    if batch is not None:
        prompt, response = lengths(batch)
        parts = pack(list(range(len(crossed))), prompt, response, budget, max_rows)
    out: list[torch.Tensor | None] = [None] * len(crossed)
    for part in padded(receiver, parts):
        if part is None:  # lockstep dummy (another rank has more forwards)
            receiver.dummy_logp(temperature)
            continue
        sub = narrow(batch.select(part))
        logp, _ = receiver.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature)
        logp = logp.detach().float().cpu()  # records live on the CPU
        for row, i in enumerate(part):
            out[i] = logp[row, : len(crossed[i].response_ids)].clone()
    return out


def answer(receiver, request: ScoringRequest, budget: int = DEFAULT_TOKEN_BUDGET, max_rows: int = 0) -> Scores:
    """The receiver's answers to ``request`` (module docstring; ``max_rows``: rows per forward, 0 = the budget
    alone, as ``algorithm.micro_batch_size``); every rank must call it for the same regimes in the same order."""
    logp = None if request.rows is None else tuple(receiver_logp(receiver, request.rows, budget, max_rows))
    sums = None if request.sums is None else tuple(agree_sum(list(request.sums)))
    maxes = None if request.maxes is None else tuple(agree_max(list(request.maxes)))
    return Scores(logp=logp, sums=sums, maxes=maxes, state=request.state)


def plan_regime(regime: Regime, receiver, own: Sequence[ScoredGroup], peers: Mapping[str, Sequence[ScoredGroup]],
                num_mini_batches: int, budget: int = DEFAULT_TOKEN_BUDGET) -> TrainingPlan:
    """``regime``'s plan for ``receiver``: its request answered (:func:`answer`), then its plan, as the step runs
    them."""
    scores = answer(receiver, regime.request(receiver, own, peers), budget)
    return regime.plan(receiver, own, peers, num_mini_batches, scores)
