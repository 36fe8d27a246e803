"""Records from vLLM's outputs (pure: no vllm import): :class:`~mutual_rl.types.Rollout` records from ``RequestOutput`` objects
and the sampled tokens' log-probs, read column-wise.

vLLM returns a completion's log-probs either as ``FlatLogprobs`` (``SamplingParams(flat_logprobs=True)``, which
``VLLMRolloutEngine`` asks for: a few flat columns, ``token_ids``, ``logprobs``, ``start_indices``, no Python object
per token) or as one ``{id: Logprob}`` dict per token. From the flat form the sampled tokens' log-probs are one
gather over the columns (:func:`sampled_logprobs`); the nested form (a request without ``flat_logprobs``) still
takes one dictionary look-up per token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mutual_rl.thl.offsets import offsets_by_decoding
from mutual_rl.types import Problem, Rollout


def sampled_logprob(entry, token_id: int) -> float:
    """The log-prob of ``token_id`` in one position of vLLM's ``logprobs`` (``{id: Logprob}`` or floats)."""
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


def sampled_logprobs(logprobs, token_ids: Sequence[int]) -> torch.Tensor:
    """The log-prob [T] of each sampled token ``token_ids[t]`` in a completion's ``logprobs`` (module docstring).

    Flat form: each position's first entry is the sampled token (``logprobs=0`` asks for nothing else; vLLM puts
    the sampled token first in any case), so the log-probs are ``logprobs[start_indices]``, checked against the
    ids in one comparison. ``ValueError`` when a position's first entry is another token."""
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:  # nested: one {id: Logprob} per position
        return torch.tensor([sampled_logprob(e, t) for e, t in zip(logprobs, token_ids)], dtype=torch.float32)
    starts = torch.as_tensor(_array(starts), dtype=torch.long)
    ids = torch.as_tensor(_array(logprobs.token_ids), dtype=torch.long)[starts]
    if len(starts) != len(token_ids) or not bool((ids == torch.as_tensor(token_ids, dtype=torch.long)).all()):
        raise ValueError("vLLM's flat log-probs do not start each position with the sampled token; sample with "
                         "SamplingParams(logprobs=0).")
    return torch.as_tensor(_array(logprobs.logprobs), dtype=torch.float32)[starts]


def _array(values):
    """A column of ``FlatLogprobs`` as a numpy array."""
    import numpy as np

    return np.asarray(values)


def build_rollouts(
    policy, problems: Sequence[Problem], prompts: Sequence[str], prompt_ids: Sequence[list[int]], outputs,
    *, step: int, group_id_base: int = 0,
) -> list[list[Rollout]]:
    """:class:`Rollout` records from vLLM ``RequestOutput``\\ s (one per problem, ``n`` completions each).

    Each completion needs ``token_ids``, ``logprobs`` (one ``{id: Logprob}`` per sampled token) and
    ``finish_reason`` (``stop`` on EOS, ``length``).
    """
    if len(outputs) != len(problems):
        raise ValueError(f"vLLM returned {len(outputs)} request outputs for {len(problems)} prompts.")
    tok, eos = policy.tokenizer, policy.tokenizer.eos_token_id
    out: list[list[Rollout]] = []
    for i, (problem, req) in enumerate(zip(problems, outputs)):
        group = []
        for c in req.outputs:
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise ValueError("vLLM completion without one log-prob per sampled token; sample with "
                                 "SamplingParams(logprobs=0).")
            stopped = bool(ids) and ids[-1] == eos
            if c.finish_reason == "stop" and not stopped:
                raise ValueError(f"vLLM stopped (finish_reason 'stop') without the EOS id {eos} as last token; "
                                 "stop strings / other stop ids are not supported (they break the RL trace).")
            logp = sampled_logprobs(c.logprobs, ids)
            body = ids[:-1] if stopped else ids
            text = tok.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            offsets = tuple(offsets_by_decoding(tok, body, text))
            if stopped:
                offsets = offsets + ((len(text), len(text)),)
            group.append(Rollout(
                policy_id=policy.name, prompt_id=problem.prompt_id, group_id=group_id_base + i, step=step,
                policy_version=policy.version, prompt_text=prompts[i], response_text=text,
                prompt_ids=torch.tensor(prompt_ids[i], dtype=torch.long),
                response_ids=torch.tensor(ids, dtype=torch.long), logp=logp, offsets=offsets,
                finish_reason="eos" if stopped else "length",
            ))
        out.append(group)
    return out


def prompt_logprobs_tail(request_output, token_ids: Sequence[int], width: int) -> torch.Tensor:
    """The last ``width`` prompt log-probs [width] of a ``prompt_logprobs`` request over ``token_ids``."""
    plp = request_output.prompt_logprobs
    if plp is None or len(plp) != len(token_ids):
        raise ValueError("vLLM returned no prompt log-probs for every prompt token (use prompt_logprobs=0).")
    tail = list(zip(plp, token_ids))[len(token_ids) - width:]
    return torch.tensor([sampled_logprob(e, t) for e, t in tail], dtype=torch.float32)
