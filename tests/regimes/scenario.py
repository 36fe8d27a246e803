"""Hand-built regime scenarios: scripted rewards, texts and log-probs, no model.

``make_group`` builds a policy's ScoredGroup for one prompt from rewards (and optional texts / per-token
log-probs); advantages are GRPO's on the group unless given. ``FakeReceiver`` stands in for a Policy: a real
(instant, local) tokenizer and a scripted ``response_logp``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mutual_rl.algorithms import grpo_advantages
from mutual_rl.model.spec import PolicySpec
from mutual_rl.presets.tokenizers import build_bpe_tokenizer, build_char_tokenizer
from mutual_rl.thl.offsets import offsets_by_decoding
from mutual_rl.thl.retokenize import prompt_ids as encode_prompt_ids
from mutual_rl.types import Rollout, ScoredGroup

_TOKENIZERS = {}


def tokenizer(kind: str):
    if kind not in _TOKENIZERS:
        _TOKENIZERS[kind] = {"char": build_char_tokenizer, "bpe": build_bpe_tokenizer}[kind]()
    return _TOKENIZERS[kind]


def make_group(
    policy_id: str,
    prompt_id: int,
    rewards: Sequence[float],
    *,
    kind: str = "char",
    texts: Sequence[str] | None = None,
    logps: Sequence[Sequence[float]] | None = None,
    advantages: Sequence[float] | None = None,
    problem: str = "12+34=",
    step: int = 0,
    group_id: int | None = None,
) -> ScoredGroup:
    """A group of ``len(rewards)`` responses (default texts "46" for reward > 0 else "47", all stopped on EOS).

    ``logps[i]`` is the per-token trace of response i *including* its EOS token (default: -0.5 per token).
    """
    tok = tokenizer(kind)
    texts = list(texts) if texts is not None else ["46" if r > 0 else "47" for r in rewards]
    p_ids = torch.tensor(encode_prompt_ids(tok, problem), dtype=torch.long)
    rollouts = []
    for i, text in enumerate(texts):
        body = tok(text, add_special_tokens=False)["input_ids"]
        ids = torch.tensor(body + [tok.eos_token_id], dtype=torch.long)
        trace = torch.tensor(logps[i], dtype=torch.float32) if logps is not None else torch.full((len(ids),), -0.5)
        if len(trace) != len(ids):
            raise ValueError(f"logps[{i}] has {len(trace)} values for {len(ids)} tokens of {text!r} (+EOS)")
        offsets = tuple(offsets_by_decoding(tok, body, text)) + ((len(text), len(text)),)
        rollouts.append(Rollout(
            policy_id=policy_id, prompt_id=prompt_id, group_id=prompt_id if group_id is None else group_id,
            step=step, policy_version=0, prompt_text=problem, response_text=text, prompt_ids=p_ids,
            response_ids=ids, logp=trace, offsets=offsets, finish_reason="eos",
        ))
    r = torch.tensor(list(rewards), dtype=torch.float32)
    adv = torch.tensor(list(advantages), dtype=torch.float32) if advantages is not None else \
        grpo_advantages(r, torch.zeros(len(r), dtype=torch.long))
    return ScoredGroup(policy_id, prompt_id, rollouts[0].group_id, tuple(rollouts), r, adv)


class FakeReceiver:
    """A Policy stand-in: ``name``, ``tokenizer``, ``spec`` and a scripted ``response_logp``.

    ``logp_fn(input_ids [B, P+T], response_width) -> [B, T]`` defaults to -1.0 for every token.
    """

    def __init__(self, name: str, kind: str = "char", logp_fn: Callable | None = None, temperature: float = 1.0):
        self.name = name
        self.tokenizer = tokenizer(kind)
        self.spec = PolicySpec(name=name, model=f"tiny:{'llama-char' if kind == 'char' else 'gpt2-bpe'}")
        self.spec.sampling.temperature = temperature
        self.logp_fn = logp_fn or (lambda ids, width: torch.full((ids.shape[0], width), -1.0))
        self.version = 0

    def response_logp(self, input_ids, attention_mask, response_width, temperature, *, with_entropy=False,
                      reference=False):
        return self.logp_fn(input_ids, response_width), None

    def render_prompt(self, problem: str) -> str:
        return problem

    def encode_prompt(self, text: str) -> list[int]:
        return encode_prompt_ids(self.tokenizer, text)
