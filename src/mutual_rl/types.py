"""Typed records that flow through a training step.

Every record carries explicit identity (``policy_id``, ``prompt_id``, ``group_id``): grouping is never inferred
from tensor layout (docs/design.md, rule 4). Tensor fields carry their shape in a comment. Log-prob names keep the three
sources apart (rule 3): ``logp`` (current policy), ``old_logp`` (behaviour policy on the receiver side) and
``source_logp`` (a peer's trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mutual_rl.data.task import Problem

FINISH_REASONS = ("eos", "length")


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
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-row [B] inputs of a regime's objective

    def __post_init__(self):
        if self.needs_old_logp is None:
            self.needs_old_logp = torch.zeros(self.input_ids.shape[0], dtype=torch.bool)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    def to(self, device: torch.device | str) -> PolicyBatch:
        """The same rows with every tensor field (``needs_old_logp`` and ``extras`` included) on ``device``: a new
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
            extras={k: v.to(device) for k, v in self.extras.items()},
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
            extras={k: v[idx] for k, v in self.extras.items()},
        )
