"""HF rollout engine: left padding, sampling as configured (top_k off, nothing from the checkpoint's
generation_config), log-probs, finish reasons, offsets."""

from __future__ import annotations

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.types import Problem, collate
from tests.module.helpers import TASK, spec

# prompts of different lengths, so left padding matters
PROBLEMS = [Problem(1, "3+4=", "7", "add"), Problem(2, "12+34=", "46", "add"), Problem(3, "99-9=", "90", "sub")]


@pytest.fixture(scope="module", params=["tiny:gpt2-bpe", "tiny:llama-char"])
def policy(request):
    return build_policy(spec("p", request.param), task=ArithmeticTask(**TASK))


def test_groups_identity_and_finish_reasons(policy):
    torch.manual_seed(0)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, SamplingSpec(n=5, max_new_tokens=3), step=7,
                                        group_id_base=100)
    assert [len(g) for g in groups] == [5, 5, 5]
    eos = policy.tokenizer.eos_token_id
    for problem, g in zip(PROBLEMS, groups):
        for r in g:
            assert (r.prompt_id, r.group_id, r.step, r.policy_id) == (problem.prompt_id, 100 + PROBLEMS.index(problem),
                                                                       7, "p")
            assert r.prompt_ids.tolist() == policy.encode_prompt(problem.problem)
            assert len(r.logp) == len(r.response_ids) == len(r.offsets) <= 3
            if r.finish_reason == "eos":
                assert r.response_ids[-1].item() == eos and eos not in r.response_ids[:-1].tolist()
            else:
                assert len(r.response_ids) == 3 and eos not in r.response_ids.tolist()
            # offsets: monotone, cover the decoded text exactly
            starts = [s for s, _ in r.offsets]
            ends = [e for _, e in r.offsets]
            assert starts[0] == 0 and ends[-1] == len(r.response_text)
            assert all(a == b for a, b in zip(ends[:-1], starts[1:]))
            assert "".join(r.response_text[s:e] for s, e in r.offsets) == r.response_text


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9)])
def test_logp_is_that_of_the_sampling_distribution(policy, temperature, top_p):
    """With top_p = 1 the sampler's log-prob equals log softmax(logits / T) of the full vocabulary (top_k off);
    with top_p < 1 it is the renormalised nucleus, hence >= the full-vocabulary value."""
    torch.manual_seed(1)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, SamplingSpec(n=6, max_new_tokens=4, temperature=temperature,
                                                                       top_p=top_p), step=0)
    rollouts = [r for g in groups for r in g]
    b = collate(rollouts, torch.zeros(len(rollouts)), policy.tokenizer.pad_token_id)
    policy.model.eval()
    with torch.no_grad():
        full, _ = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, temperature)
    policy.model.train()
    full = full * b.response_mask
    if top_p == 1.0:
        torch.testing.assert_close(full, b.old_logp, rtol=0, atol=2e-5)
    else:
        assert bool(((b.old_logp - full) >= -2e-5).all())
        assert bool(((b.old_logp - full) > 1e-3).any())  # the nucleus really cut something


def test_top_k_is_applied_only_when_set(policy):
    torch.manual_seed(2)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, SamplingSpec(n=8, max_new_tokens=2, top_k=2), step=0)
    rollouts = [r for g in groups for r in g]
    b = collate(rollouts, torch.zeros(len(rollouts)), policy.tokenizer.pad_token_id)
    with torch.no_grad():
        full, _ = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, 1.0)
    # with top-2 the renormalised log-prob is >= log(1/2) for the more likely of two tokens... and never below full
    assert bool((((b.old_logp - full * b.response_mask)) >= -2e-5).all())
    assert bool(((b.old_logp - full * b.response_mask) > 1e-3).any())


# What a checkpoint's generation_config.json may ship: each entry adds a logits processor or warper to ``generate``
# unless the engine neutralises it (none is set by SamplingSpec below).
CHECKPOINT_GENERATION = dict(
    repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3, top_k=3, typical_p=0.5,
    epsilon_cutoff=3e-3, eta_cutoff=3e-3, min_p=0.05, bad_words_ids=[[5]], suppress_tokens=[6, 7],
    begin_suppress_tokens=[8], sequence_bias=[[[9], 4.0]], forced_eos_token_id=10,
    exponential_decay_length_penalty=(1, 1.5), renormalize_logits=True, encoder_repetition_penalty=1.3,
    do_sample=True, temperature=0.3, top_p=0.5,  # these three SamplingSpec does set
)


@pytest.mark.parametrize("preset", ["tiny:gpt2-bpe", "tiny:llama-char"])
def test_checkpoint_generation_config_changes_no_logp(tmp_path, preset):
    """A checkpoint whose generation_config sets many processors: the rollout log-prob of every sampled token is
    still the trainer's log softmax(logits / T) over the full vocabulary, and the model's config is left as is."""
    from mutual_rl.model.spec import PolicySpec
    from mutual_rl.presets.models import build_untrained

    model, tok = build_untrained(preset, seed=0)
    for key, value in CHECKPOINT_GENERATION.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = build_policy(PolicySpec(name="ckpt", model=str(tmp_path)))
    assert policy.model.generation_config.repetition_penalty == 1.5  # really loaded from the checkpoint
    torch.manual_seed(3)
    sampling = SamplingSpec(n=6, max_new_tokens=6, temperature=0.7)
    groups = HFRolloutEngine().generate(policy, PROBLEMS, sampling, step=0)
    rollouts = [r for g in groups for r in g]
    b = collate(rollouts, torch.zeros(len(rollouts)), policy.tokenizer.pad_token_id)
    policy.model.eval()
    with torch.no_grad():
        full, _ = policy.response_logp(b.input_ids, b.attention_mask, b.response_width, sampling.temperature)
    gap = ((full - b.old_logp) * b.response_mask).abs().max().item()
    assert gap <= 1e-5, f"rollout log-probs differ from the trainer's by up to {gap:.4f}"
    assert policy.model.generation_config.repetition_penalty == 1.5  # restored after generate
    assert policy.model.generation_config.top_k == 3
