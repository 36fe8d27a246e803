"""Prompts that do not fit a policy's context, as a run meets them: one error at set-up, or (``prompt_overflow:
truncate``) training on the prompt's tail."""

from __future__ import annotations

import json

import pytest

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from tests.module.helpers import trainer


def _spec(name: str = "char", n: int = 2, max_new_tokens: int = 5) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=n, max_new_tokens=max_new_tokens))


def _prompt_file(tmp_path, problems: list[str]):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"problem": p, "answer": "1"}) for p in problems) + "\n")
    return path


LONG = "1" * 300 + "+1="


def test_prompt_longer_than_the_context_fails_at_set_up(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG, "2+3=", "4+4="]))], batch_size=2)
    m = MutualRLModule([_spec()], reward="test_parity", log_samples_every_n_steps=0)
    with pytest.raises(ValueError) as err:
        trainer(tmp_path, max_steps=1).fit(m, datamodule=dm)
    msg = str(err.value)
    assert "policy 'char' (tiny:llama-char): 1 of 4 prompts do not fit its context length 256" in msg
    assert f"prompt {10**9 + 1} '1111" in msg  # file rows are numbered from 10**9
    assert "304 prompt tokens + 5 (sampling.max_new_tokens) = 309 > 256" in msg
    assert "model.prompt_overflow: truncate" in msg


@pytest.mark.slow
def test_truncate_mode_trains_on_the_prompt_tail(tmp_path, preset_cache):
    dm = PromptDataModule(train_files=[str(_prompt_file(tmp_path, ["1+1=", LONG]))], batch_size=2)
    gpt2 = PolicySpec(name="bpe", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=2, max_new_tokens=5))  # learned positions: 256 is a hard limit
    m = MutualRLModule([_spec(), gpt2], reward="test_parity", log_samples_every_n_steps=0,
                       prompt_overflow="truncate", eval_at_start=False)
    fit = trainer(tmp_path, max_steps=1)
    fit.fit(m, datamodule=dm)  # the batch holds the long prompt
    assert fit.global_step == 1
    assert m.prompts_truncated == {"char": 1, "bpe": 1}
    for policy in m.policies.values():
        assert len(policy.encode_prompt(policy.render_prompt(LONG))) == 256 - 5
