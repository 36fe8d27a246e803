"""Greedy decoding for greedy accuracy: one ``generate(do_sample=False)`` completion per problem.

``SamplingSpec`` describes sampled rollouts (a tiny temperature is still sampling, and ties and top-p make it
differ from argmax), so greedy accuracy decodes here with the policy's own model and tokenizer: prompts rendered
and encoded as the rollout engine does (``policy.render_prompt`` / ``policy.encode_prompt``), left-padded, batched,
``do_sample=False`` with one beam, stopped at EOS or ``max_new_tokens``. The completion text is decoded as the
engine decodes rollouts (special tokens skipped, terminal EOS removed, no clean-up of spaces), so rewards see the
same kind of text. Consumes no random numbers. The checkpoint's own ``generation_config`` adds nothing (no
repetition penalty, suppressed tokens, ...): ``generate`` runs with exactly the config built here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from mutual_rl.distributed import in_lockstep, padded
from mutual_rl.rollout.decode_attention import decode_attention
from mutual_rl.rollout.hf import only_config
from mutual_rl.strategies import generation_params
from mutual_rl.types import Problem
from mutual_rl.warnings_filters import finished_row_pad_alarm_silenced


@torch.no_grad()
def greedy_generate(policy, problems: Sequence[Problem], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """Greedy completion text of ``policy`` for each problem (module docstring)."""
    tok = policy.tokenizer
    prompt_ids = [policy.encode_prompt(policy.render_prompt(p.problem)) for p in problems]
    cfg = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = policy.model
    was_training = model.training
    model.eval()
    out: list[str] = []
    synced = in_lockstep(policy)  # FSDP, several ranks: same number of generate calls everywhere
    starts = padded(policy, list(range(0, len(prompt_ids), batch_size)))
    try:
        for start in starts:
            chunk = prompt_ids[start : start + batch_size] if start is not None else [policy.dummy_prompt_ids()]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for r, p in enumerate(chunk):  # left padding
                ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
                attn[r, width - len(p):] = 1
            # the mask is passed: transformers' padding warning is a false alarm
            with generation_params(model) as gen_model, only_config(gen_model, cfg), decode_attention(gen_model), \
                    finished_row_pad_alarm_silenced():
                seq = gen_model.generate(input_ids=ids.to(policy.device), attention_mask=attn.to(policy.device),
                                         generation_config=cfg, **({"synced_gpus": True} if synced else {}))
            seq = seq[:, width:].cpu()
            if start is not None:
                out.extend(decode_completion(tok, row) for row in seq)
    finally:
        model.train(was_training)
    return out


def decode_completion(tokenizer, ids: torch.Tensor) -> str:
    """Text of generated ids up to (excluding) the first EOS, decoded as rollouts are."""
    ids = ids.tolist()
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
