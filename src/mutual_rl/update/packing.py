"""Micro-batches packed to a token budget, and each one's forward on its own width (no padding beyond its rows).

The budget bounds what one forward costs: a micro-batch of ``n`` rows whose longest real prompt is ``p`` and
longest real response ``t`` tokens runs on ``n · (p + t)`` token positions (:func:`cost`: the columns every one of
its rows pads are cut away, :func:`narrow`). :func:`pack` sorts the rows by length, longest first (stable), and
fills each micro-batch while its cost stays within the budget (and its row count within ``max_rows`` when that is
set); a row longer than the budget alone is a micro-batch of one. The idea is verl's dynamic batch size
(``ppo_max_token_len_per_gpu``); the greedy first-fit over sorted rows is ours.

Same results as one forward over all rows: each row's log-probs depend only on its own tokens (positions come from
the attention mask, so cutting columns that are padding in every row of a micro-batch moves nothing; masked keys
weigh exactly 0), and the loss normalisers are those of the whole mini-batch, so summing micro-batch gradients
is the mini-batch's gradient up to float rounding: a forward on fewer columns or rows runs its kernels on other
shapes, which moves float32 log-probs of magnitude ~10 by about one unit in the last place (measured up to 9.5e-7;
rows batched differently alone: 0.0). Tested within 1e-6 + 1e-6·|value| in float32 for log-probs and every
gradient, budgets from one row per micro-batch to all rows (``tests/update/test_packing.py``).
"""

from __future__ import annotations

import torch

from mutual_rl.types import OPTIONAL_ROW_FIELDS, PolicyBatch

DEFAULT_TOKEN_BUDGET = 16384
"""Tokens per micro-batch where ``algorithm.max_tokens_per_micro_batch`` is auto and no memory plan ran."""

_PER_TOKEN_FIELDS = ("gen_logp",)  # optional fields of width T (the others are per row)


def lengths(batch: PolicyBatch) -> tuple[list[int], list[int]]:
    """Real prompt and response lengths of every row (one device read of each)."""
    width = batch.response_width
    prompt = batch.attention_mask[:, :-width].sum(-1) if batch.input_ids.shape[1] > width else \
        torch.zeros(len(batch), dtype=torch.long)
    response = batch.attention_mask[:, -width:].sum(-1)
    return prompt.tolist(), response.tolist()


def cost(rows: list[int], prompt: list[int], response: list[int]) -> int:
    """Token positions one forward over ``rows`` runs on: rows × (longest prompt + longest response, at least 1)."""
    if not rows:
        return 0
    return len(rows) * (max(prompt[r] for r in rows) + max(max(response[r] for r in rows), 1))


def pack(rows: list[int], prompt: list[int], response: list[int], budget: int, max_rows: int = 0) -> list[list[int]]:
    """``rows`` in micro-batches of at most ``budget`` token positions (:func:`cost`) and ``max_rows`` rows (0: no
    row limit), longest rows first; each micro-batch's rows in their original order."""
    if budget < 1:
        raise ValueError(f"the token budget must be >= 1 (got {budget}).")
    order = sorted(rows, key=lambda r: -(prompt[r] + response[r]))  # stable: ties keep their order
    parts: list[list[int]] = []
    current: list[int] = []
    for r in order:
        if current and (cost(current + [r], prompt, response) > budget or (max_rows and len(current) >= max_rows)):
            parts.append(current)
            current = []
        current.append(r)
    if current:
        parts.append(current)
    position = {r: i for i, r in enumerate(rows)}
    return [sorted(p, key=position.__getitem__) for p in parts]


def narrow(batch: PolicyBatch, size: tuple[int, int] | None = None) -> PolicyBatch:
    """``batch`` without the columns that are padding in every row: the leading prompt columns no row uses and the
    trailing response columns past its longest response (at least one kept). Per-token fields keep their first
    ``t`` columns; the caller pads results back to the full width (:func:`widen`). ``size``: the rows' longest
    prompt and response when the caller knows them (:func:`part_size`; no device read), else read here."""
    width = batch.response_width
    if size is None:
        prompt, response = lengths(batch)
        size = (max(prompt, default=0), max(response, default=0))
    p, t = size[0], max(size[1], 1)
    start = batch.input_ids.shape[1] - width - p
    cols = slice(start, batch.input_ids.shape[1] - width + t)
    extra = {k: getattr(batch, k) for k in OPTIONAL_ROW_FIELDS}
    for k in _PER_TOKEN_FIELDS:
        if extra.get(k) is not None:
            extra[k] = extra[k][:, :t]
    return PolicyBatch(input_ids=batch.input_ids[:, cols], attention_mask=batch.attention_mask[:, cols],
                       response_mask=batch.response_mask[:, :t], old_logp=batch.old_logp[:, :t],
                       advantages=batch.advantages, weights=batch.weights, is_peer=batch.is_peer,
                       prompt_ids=list(batch.prompt_ids), needs_old_logp=batch.needs_old_logp, **extra)


def part_size(rows: list[int], prompt: list[int], response: list[int]) -> tuple[int, int]:
    """The longest prompt and response among ``rows`` (lengths from :func:`lengths`), for :func:`narrow`."""
    return max((prompt[r] for r in rows), default=0), max((response[r] for r in rows), default=0)


def widen(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` [n, t] padded with zeros to [n, width]."""
    if values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def token_budget(policy, configured) -> int:
    """The policy's budget: ``configured`` when a number; else the memory plan's (``policy.token_budget``), else
    :data:`DEFAULT_TOKEN_BUDGET`."""
    if configured != "auto":
        return int(configured)
    return int(getattr(policy, "token_budget", None) or DEFAULT_TOKEN_BUDGET)


@torch.no_grad()
def packed_response_logp(policy, batch: PolicyBatch, rows: list[int], temperature: float, budget: int,
                         max_rows: int = 0) -> torch.Tensor:
    """The policy's log-probs [len(rows), T] of ``rows`` of ``batch`` (zeros past each response), in packed
    micro-batches (no lockstep: one process or an unsharded policy; the update loop pads them for FSDP)."""
    prompt, response = lengths(batch)
    out = torch.zeros(len(rows), batch.response_width, dtype=torch.float32, device=policy.device)
    where = {r: i for i, r in enumerate(rows)}
    for part in pack(rows, prompt, response, budget, max_rows):
        sub = narrow(batch.select(part))
        logp, _ = policy.response_logp(sub.input_ids, sub.attention_mask, sub.response_width, temperature)
        out[[where[r] for r in part]] = widen(logp.float() * sub.response_mask.to(logp.device), batch.response_width)
    return out
