"""Typed records that flow through a training step.

Every record carries explicit identity (``policy_id``, ``prompt_id``, ``group_id``): grouping is never inferred
from tensor layout (docs/design.md, rule 4). Tensor fields carry their shape in a comment. Log-prob names keep the three
sources apart (rule 3): ``logp`` (current policy), ``old_logp`` (behaviour policy on the receiver side) and
``source_logp`` (a peer's trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mutual_rl.stats import ObjectiveStats

FINISH_REASONS = ("eos", "length")


@dataclass(frozen=True)
class Problem:
    """One prompt: ``problem`` text, gold ``answer`` text, and the ``skill`` it exercises (may be ``""``).

    ``columns``: the other fields of the dataset row it came from (name -> value), which TRL-style rewards get as
    keyword arguments; ``None`` for generated tasks. Not part of equality or the hash.
    """

    prompt_id: int
    problem: str
    answer: str
    skill: str = ""
    columns: dict[str, Any] | None = field(default=None, compare=False, hash=False)


class PromptBatch:
    """One training step's prompts on this process, as the data module yields them.

    ``index`` is the position of this batch in the (seeded, endless) prompt stream; the module reports it back
    so that a checkpoint resumes at the next batch. ``offset`` is the stream position of ``problems[0]``
    (``index * batch_size * world_size + rank * batch_size``), so group ids built from it are unique across ranks.

    Deliberately not a dataclass: Lightning's ``apply_to_collection`` (device transfer, the FSDP/mixed-precision
    input conversion) recurses into dataclasses and rejects the frozen :class:`Problem` records; this class is one
    opaque value to it. It holds text, never tensors.
    """

    __slots__ = ("index", "problems", "offset")

    def __init__(self, index: int, problems: list[Problem], offset: int | None = None):
        self.index = index
        self.problems = problems
        self.offset = index * len(problems) if offset is None else offset

    def __eq__(self, other) -> bool:
        return isinstance(other, PromptBatch) and (self.index, self.problems, self.offset) == (
            other.index, other.problems, other.offset)

    def __repr__(self) -> str:
        return f"PromptBatch(index={self.index}, offset={self.offset}, problems=<{len(self.problems)}>)"


@dataclass(frozen=True)
class Rollout:
    """One sampled response of one policy to one prompt."""

    policy_id: str
    prompt_id: int
    group_id: int
    step: int
    policy_version: int
    prompt_text: str  # the prompt as rendered in this policy's own format
    response_text: str  # decoded response, special tokens skipped, terminal EOS removed
    prompt_ids: torch.Tensor  # [P] long, this policy's tokenization (incl. BOS if its tokenizer adds one)
    response_ids: torch.Tensor  # [T] long, sampled ids (incl. the EOS if it stopped on EOS)
    logp: torch.Tensor  # [T] float, behaviour log-prob of each sampled token under the sampling distribution
    offsets: tuple[tuple[int, int], ...]  # T (start, end) char spans of response tokens in response_text
    finish_reason: str  # "eos" | "length"


@dataclass(frozen=True)
class CrossedRollout:
    """A peer's rollout carried into a receiver's tokenization as text (docs/methods.md §2.1).

    ``source`` is the peer's original record (its ids, trace and offsets in its own tokenization); the other
    fields are in the *receiver's* tokenization. The two log-prob fields keep the sources apart (docs/design.md,
    rule 3):

    * ``source_logp``: the source trace aligned onto the receiver's tokens (docs/methods.md §2.2,
      mass-preserving) when alignment was requested (``aligned``), else zeros;
    * ``old_logp``: the behaviour log-probs the receiver's update uses for these tokens, set by the regime that
      decided them (GRAFT: the receiver's own old log-probs; PRP ``peer_aligned``: the aligned trace, by its
      rule), else ``None`` -- then the receiver recomputes its own old log-probs before the update
      (``PolicyBatch.needs_old_logp``).
    """

    source: Rollout
    receiver_id: str
    prompt_ids: torch.Tensor  # [P] long, receiver's prompt in its own format
    response_ids: torch.Tensor  # [T] long, receiver's tokens of source.response_text (+ its EOS iff source stopped)
    offsets: tuple[tuple[int, int], ...]  # T spans in source.response_text (EOS: zero-width at the end)
    source_logp: torch.Tensor  # [T] float, aligned source trace (zeros when not aligned)
    aligned: bool
    old_logp: torch.Tensor | None = None  # [T] float, receiver-side behaviour log-probs, when a regime set them

    @property
    def prompt_id(self) -> int:
        return self.source.prompt_id

    @property
    def policy_id(self) -> str:
        return self.source.policy_id


@dataclass(frozen=True)
class ScoredGroup:
    """A policy's group of ``n`` rollouts for one prompt, with rewards and GRPO advantages."""

    policy_id: str
    prompt_id: int
    group_id: int
    rollouts: tuple[Rollout, ...]
    rewards: torch.Tensor  # [n] float
    advantages: torch.Tensor  # [n] float


#: the per-row tensor fields of :class:`PolicyBatch` that only some objectives read (``None`` otherwise)
OPTIONAL_ROW_FIELDS = ("gen_logp", "source_mean_logp", "cap_ratio")


@dataclass
class PolicyBatch:
    """A policy's training batch in the policy's own tokenization.

    Layout per row: ``[left-padded prompt (width P) | right-padded response (width T)]``; the response window
    is the last ``T`` columns, so the logits of response tokens are the last ``T + 1`` positions (minus one)
    and a forward pass computes only those (``logits_to_keep``). Position ids come from the attention mask.
    Row ``i`` is one response; ``response_mask`` marks the response tokens that carry loss.

    Regimes build it on the CPU, as the records it comes from; the update moves it to the policy's device once
    (:meth:`to`).
    """

    input_ids: torch.Tensor  # [B, P + T] long
    attention_mask: torch.Tensor  # [B, P + T] long
    response_mask: torch.Tensor  # [B, T] float, 1 on real response tokens
    old_logp: torch.Tensor  # [B, T] float, behaviour log-probs of the response tokens (0 on padding)
    advantages: torch.Tensor  # [B] float
    weights: torch.Tensor  # [B] float, per-sequence loss weight (1 for own rollouts)
    is_peer: torch.Tensor  # [B] bool, response came from another policy
    prompt_ids: list[int] = field(default_factory=list)  # B prompt ids (identity, for ordering and logging)
    needs_old_logp: torch.Tensor | None = None  # [B] bool: the receiver recomputes old_logp before the update
    # inputs only some objectives read (None when the plan's objective does not take them):
    gen_logp: torch.Tensor | None = None  # [B, T] float, the generator's trace of peer rows (F-TIS; 0 on own rows)
    source_mean_logp: torch.Tensor | None = None  # [B] float, mean log-prob of each peer row under its source (HACPO)
    cap_ratio: torch.Tensor | None = None  # [B] float, the receiver's over the row's source's capability (HACPO)

    def __post_init__(self):
        if self.needs_old_logp is None:
            self.needs_old_logp = torch.zeros(self.input_ids.shape[0], dtype=torch.bool)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    def to(self, device: torch.device | str) -> PolicyBatch:
        """The same rows with every tensor field (``needs_old_logp`` and the optional ones included) on ``device``: a new
        batch (tensors already on ``device`` are shared, not copied)."""
        return PolicyBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_mask=self.response_mask.to(device),
            old_logp=self.old_logp.to(device),
            advantages=self.advantages.to(device),
            weights=self.weights.to(device),
            is_peer=self.is_peer.to(device),
            prompt_ids=list(self.prompt_ids),
            needs_old_logp=self.needs_old_logp.to(device),
            **{k: None if getattr(self, k) is None else getattr(self, k).to(device) for k in OPTIONAL_ROW_FIELDS},
        )

    def select(self, rows: torch.Tensor | list[int]) -> PolicyBatch:
        """The sub-batch of the given rows (keeps identity)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return PolicyBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            response_mask=self.response_mask[idx],
            old_logp=self.old_logp[idx],
            advantages=self.advantages[idx],
            weights=self.weights[idx],
            is_peer=self.is_peer[idx],
            prompt_ids=[self.prompt_ids[i] for i in idx.tolist()],
            needs_old_logp=self.needs_old_logp[idx],
            **{k: None if getattr(self, k) is None else getattr(self, k)[idx] for k in OPTIONAL_ROW_FIELDS},
        )


@dataclass
class NLLTerm:
    """An extra supervised term ``coef · mean_rows[(1/|o|) Σ_t −log π(o_t | q, o_<t)]`` (SGT), held per update.

    ``mini_batches[i]`` lists the rows of ``batch`` whose NLL is added to the plan's ``i``-th mini-batch
    (one list per plan mini-batch; each row in exactly one list). Mini-batch ``i`` adds
    ``coef · Σ_{rows of i} NLL / (rows of i)``: ``coef`` times the mean NLL of the rows it holds, the weight the
    GRPO term has in every update; a mini-batch with no rows adds nothing (per PPO epoch). Under FSDP lockstep
    the mean is over the rows of mini-batch ``i`` on every rank.
    """

    batch: PolicyBatch
    mini_batches: list[list[int]]
    coef: float


@dataclass(frozen=True)
class Norms:
    """A mini-batch's loss normalisers (global ones under FSDP lockstep); ``None``: this call's own count over all
    its rows."""

    token_count: torch.Tensor | float | None
    """Response tokens (the token-mean denominator)."""
    num_seqs: float | None
    """Sequences with at least one response token (the sequence-mean denominator)."""
    max_len: int | None
    """The policy's configured maximum response length (the constant of ``seq-mean-token-sum-norm``)."""
    is_peer: tuple[bool, ...] | None = None
    """Per row of the micro-batch, whether it is a peer row, on the host (``None``: read from ``sub.is_peer``).
    Objectives choose their row sets from it, so a micro-batch costs no device read."""
    has_tokens: tuple[bool, ...] | None = None
    """Per row, whether it has a response token, on the host (``None``: read from ``sub.response_mask``)."""

    def peer_flags(self, sub) -> tuple[bool, ...]:
        """:attr:`is_peer`, or ``sub``'s read once."""
        return self.is_peer if self.is_peer is not None else tuple(bool(p) for p in sub.is_peer.tolist())

    def token_flags(self, sub) -> tuple[bool, ...]:
        """:attr:`has_tokens`, or ``sub``'s read once."""
        return self.has_tokens if self.has_tokens is not None else \
            tuple(bool(n) for n in (sub.response_mask.sum(-1) > 0).tolist())


class Objective(Protocol):
    """A training plan's loss (:mod:`mutual_rl.update.objectives` defines the built-in ones; its docstring says
    what :func:`mutual_rl.update.loop.update_policy` calls). Here, below the regimes that choose one and the update
    that calls it."""

    def with_algorithm(self, base: Objective) -> Objective:
        """This objective with the algorithm's scalars it leaves ``None`` taken from ``base`` (the algorithm's DAPO
        objective)."""

    def loss(self, logp: torch.Tensor, sub: PolicyBatch, norms: Norms, ref_logp: torch.Tensor | None = None,
             update_index: int = 0) -> tuple[torch.Tensor, ObjectiveStats]:
        """The loss of one micro-batch and its statistics."""


@dataclass(frozen=True)
class ScoringRequest:
    """What a regime needs computed before it can plan (``Regime.request``): the step runs it, in one place
    (``mutual_rl.step.scoring``), so a regime never runs a forward or a collective itself.

    ``rows``: crossed peer responses whose log-probs the receiver must give (its current weights, its sampling
    temperature), in forwards packed to the step's token budget; ``None``: the regime scores nothing (every rank
    alike; an empty tuple still joins the other ranks' forwards under FSDP). ``sums`` / ``maxes``: numbers to add /
    take the maximum of over every process (``None``: no collective). ``state``: the regime's own intermediate
    results, handed back unchanged in :class:`Scores` so the plan need not redo them.
    """

    rows: tuple[CrossedRollout, ...] | None = None
    sums: tuple[float, ...] | None = None
    maxes: tuple[int, ...] | None = None
    state: Any = None


@dataclass(frozen=True)
class Scores:
    """The answers to a :class:`ScoringRequest`: ``logp[i]`` the receiver's log-probs ``[T_i]`` (CPU, float32) of
    ``request.rows[i]``; ``sums`` / ``maxes`` over every process; the request's ``state``."""

    logp: tuple[torch.Tensor, ...] | None = None
    sums: tuple[float, ...] | None = None
    maxes: tuple[int, ...] | None = None
    state: Any = None


@dataclass
class TrainingPlan:
    """What one receiver trains on this step.

    ``flows[source]`` accounts for every peer response delivered to this receiver: ``{"consumed": n,
    "<drop reason>": m, ...}`` in units of responses (the exchange checks that nothing is lost).
    ``objective`` is the loss (an ``update.objectives`` record, e.g. ``PRPTruncatedIS(is_cap=2.0)``; the update
    fills in the algorithm's scalars it leaves ``None``); ``None``: DAPO with the algorithm's scalars.
    ``crossed`` lists the peer responses this plan carried into the receiver's tokenization (THL), for the
    residual report; ``None`` for a regime that crosses no text.
    ``metrics`` is the regime's own statistics of this plan: a frozen record of its class's ``stats_type``
    (e.g. ``regimes.sgt.SGTStats``), or ``None`` (``NoSharing``, or a plan built by hand). The step puts it in
    its report (``PolicyStepReport.regime``) and :func:`mutual_rl.stats.flatten` gives its logged names
    (``rescued/<source>``, ``gate_rate``, ``prp/peer_rows``, ...).
    """

    batch: PolicyBatch
    mini_batches: list[list[int]]  # row indices of each mini-batch, in execution order
    metrics: Any = None
    flows: dict[str, dict[str, int]] = field(default_factory=dict)
    objective: Objective | None = None
    nll: NLLTerm | None = None
    crossed: list | None = None
    histograms: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> 1-D values, logged as histograms


def collate(
    rollouts: Sequence[Rollout | CrossedRollout],
    advantages: Sequence[float] | torch.Tensor,
    pad_id: int,
    weights: Sequence[float] | torch.Tensor | None = None,
    is_peer: Sequence[bool] | None = None,
    needs_old_logp: Sequence[bool] | torch.Tensor | None = None,
    **optional: torch.Tensor | None,
) -> PolicyBatch:
    """Rows in the order given; ``old_logp`` is each own rollout's ``logp`` (the sampler's trace) and each crossed
    rollout's ``old_logp`` (the behaviour log-probs its regime set; zeros when ``None``).

    ``is_peer`` defaults to "is a :class:`CrossedRollout`"; ``needs_old_logp`` defaults to "is a crossed
    rollout whose ``old_logp`` is ``None``" (the receiver must recompute its own old log-probs for it).
    """
    n = len(rollouts)
    if n == 0:
        raise ValueError("cannot collate an empty list of rollouts")
    width_p = max(len(r.prompt_ids) for r in rollouts)
    width_t = max(max(len(r.response_ids) for r in rollouts), 1)
    ids = torch.full((n, width_p + width_t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width_p + width_t), dtype=torch.long)
    mask = torch.zeros((n, width_t))
    old = torch.zeros((n, width_t))
    for i, r in enumerate(rollouts):
        p, t = len(r.prompt_ids), len(r.response_ids)
        ids[i, width_p - p : width_p] = r.prompt_ids
        ids[i, width_p : width_p + t] = r.response_ids
        attn[i, width_p - p : width_p + t] = 1
        mask[i, :t] = 1.0
        behaviour = r.old_logp if isinstance(r, CrossedRollout) else r.logp
        if behaviour is not None:
            old[i, :t] = behaviour.float()
    return PolicyBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=mask,
        old_logp=old,
        advantages=torch.as_tensor(advantages, dtype=torch.float32).reshape(n),
        weights=torch.ones(n) if weights is None else torch.as_tensor(weights, dtype=torch.float32).reshape(n),
        is_peer=torch.tensor([isinstance(r, CrossedRollout) for r in rollouts], dtype=torch.bool)
        if is_peer is None else torch.as_tensor(is_peer, dtype=torch.bool),
        prompt_ids=[r.prompt_id for r in rollouts],
        needs_old_logp=torch.tensor([isinstance(r, CrossedRollout) and r.old_logp is None for r in rollouts],
                                    dtype=torch.bool)
        if needs_old_logp is None else torch.as_tensor(needs_old_logp, dtype=torch.bool),
        **optional,
    )
